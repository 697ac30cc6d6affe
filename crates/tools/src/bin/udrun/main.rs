//! `udrun`: the launcher of udbtl jobs, a small `mpiexec`.
//!
//! ```text
//! udrun -n N [-H|--host H[:SLOTS],... | --hostfile FILE] [--oversubscribe]
//!       [--bind-to core|none] [-x VAR[=VALUE]]... [--tag-output] [--timeout SECONDS]
//!       [--startup-timeout SECONDS] [--report-startup] [--pmi-listen-any]
//!       [--] PROGRAM [ARGS...]
//! ```
//!
//! It starts N ranks of PROGRAM, serves them PMI-1 (the protocol lives in
//! `udbtl-pmi`; see [`udbtl_pmi::server`]), forwards their output, and ends
//! the job when a rank fails. `--` is needed only when PROGRAM or its first
//! argument could be taken for one of udrun's options: everything from
//! PROGRAM on is the rank's command line. mpirun's `-np N` is `-n N`, and
//! its `-host`, `-hostfile` and the like are udrun's options; its options
//! udrun lacks (`--map-by`, `--mca`, ...) are refused with what to do
//! instead (see [`mpirun`]).
//!
//! # What a rank gets
//!
//! | variable | value |
//! | --- | --- |
//! | `PMI_FD`, `PMI_RANK`, `PMI_SIZE` | local ranks: an inherited socket to udrun's PMI server (hydra's default) |
//! | `PMI_PORT`, `PMI_ID` | remote ranks: `<udrun's host>:<port>` and the rank (hydra's `-pmi-port` mode) |
//! | `UDBTL_JOB_KEY`, `UDRUN_JOB_KEY` | the job key, a random non-zero `u32` in decimal, new for every launch (the BTL's `job_key` parameter reads the first); remote ranks get it on their launcher's stdin, not its command line |
//! | `UDBTL_PMI_SECRET` | the job's secret (64 hex digits, new for every launch): remote ranks prove it in their `PMI_PORT` handshake, and with `UDBTL_AUTH=1` every rank's datagram keys derive from it; local ranks get it in their environment, remote ranks on the launcher's stdin, never a command line (see [`remote`]) |
//! | `UDRUN_LOCAL_RANK`, `UDRUN_LOCAL_SIZE` | the rank's index among the ranks of its host, and their number |
//! | `-x VAR=VALUE` | set; `-x VAR` passes udrun's value to remote ranks (local ones inherit udrun's environment); VAR unset in udrun's environment is an error |
//!
//! udrun's stdin goes to rank 0 when it runs here (not when udrun's stdin
//! is a terminal udrun does not own); the other ranks read `/dev/null`.
//! stdout and stderr go to udrun's, whole lines at a time, prefixed with
//! `[RANK] ` under `--tag-output`; without it, the same stderr message
//! (what a rank wrote in one burst, one or more lines) from several ranks
//! within 250 ms is written once, each line as `[ranks 0-3] LINE` (see
//! [`output`] and [`merge`]). The PMI key-value space is named
//! `udrun-<udrun's pid>-<job key in hex>`.
//!
//! # Ending a job (fail-fast)
//!
//! udrun ends the job at the first failure, prints one line about it and
//! exits with its status; the other ranks get SIGTERM at once (their whole
//! process group, so what they started goes too) and SIGKILL 2 s later.
//! Hydra does the same for a crash; for a plain non-zero exit it lets the
//! others run to their end, which for a job that waits on the failed rank
//! means forever, so udrun kills them at once there too. A failure is:
//!
//! | what | line (after `udrun: `) | exit status |
//! | --- | --- | --- |
//! | a rank exits non-zero | `rank 2 (pid 1234) exited with code 3; killing the job` | 3 |
//! | a rank dies of a signal | `rank 1 (pid 99) killed by signal 11 (SIGSEGV); killing the job` | 128 + 11 |
//! | a rank calls PMI abort | `rank 0 (pid 5) called abort with code 7: <message>` | 7 (never 0) |
//! | a rank that used PMI loses its connection and is still running 1 s later | `rank 1 (pid 6) closed its PMI connection without finalize; killing the job` | 1 |
//! | a rank that used PMI exits 0 without PMI finalize (as hydra) | `rank 1 (pid 6) exited without calling PMI finalize` | 1 |
//! | once a rank has used PMI, a rank exits 0 without PMI init (as Open MPI) | `rank 1 (pid 6) exited without calling PMI init, which rank 0 did; killing the job` | 1 |
//! | `--timeout S` passes | `the job ran longer than --timeout S s; killing the job` | 124 (as timeout(1)) |
//! | once a rank uses PMI, a running rank has not reached it `--startup-timeout S` after the launch (60 s by default) | `rank 2 (host h, ssh pid 7) did not connect to PMI within --startup-timeout 60 s (nor did 1 other rank); killing the job` | 1 |
//! | a rank breaks the PMI protocol | `rank 1 (pid 6) broke the PMI protocol (<detail>); killing the job` | 1 |
//! | PROGRAM cannot be started | `cannot start <prog>: No such file or directory` | 127 (126 if not executable) |
//! | a rank cannot be started (out of processes, descriptors, memory) | `cannot start rank 3 (<prog>): Too many open files` | 1 |
//! | udrun gets SIGINT, SIGTERM, SIGHUP or SIGQUIT | `interrupted by SIGINT; job killed` (once the ranks are gone) | 128 + signal |
//! | udrun's stdout (or stderr) is closed by its reader (`udrun ... \| head`) | none: the job ends quietly, as a pipeline's writer does | 141 (128 + SIGPIPE) |
//!
//! Only the first failure counts: ranks killed because of it are not
//! reported. A failed rank's line comes after everything that rank wrote
//! (see [`supervise`]). A second signal skips the grace period. A program that never
//! touches its PMI socket (`udrun -n 2 hostname`), in a job where no rank
//! does, is judged by its exit status alone. When the last rank has ended, whatever is still running
//! in the ranks' process groups is killed (as at the end of a Slurm job
//! step); udrun is a child subreaper and reaps everything it is handed, so
//! it leaves neither orphans nor zombies behind (a process that left its
//! rank's process group with `setsid` is beyond its reach). If udrun itself
//! is killed with SIGKILL, local ranks get SIGKILL at once (a parent-death
//! signal, see [`spawn`]; what they started themselves lives on) and
//! remote ranks are killed (see [`remote`]).
//!
//! # Hosts
//!
//! `--host a,b:2` (or `-H`) or `--hostfile F` (lines `HOST [slots=N]`, `#`
//! comments); no host means all ranks run here. Ranks fill the hosts in
//! order, each host taking SLOTS consecutive ranks (1 by default). As in
//! mpirun, the slots are a limit: more ranks than slots (without a host
//! list: than the CPUs udrun may use) is refused before anything starts,
//! unless `--oversubscribe` (or `UDRUN_OVERSUBSCRIBE=1`), with which they
//! wrap around (see [`hosts`]). A job that udrun's limits on file
//! descriptors, processes or threads cannot hold is refused too, naming
//! the limit (3 descriptors and 4 tasks per rank; the soft descriptor
//! limit is raised to the hard one when needed). `localhost`,
//! `127.x.x.x`, `::1` and this machine's name run here over socketpairs;
//! other hosts are first checked with `ssh HOST true` (an unreachable host
//! fails the launch with `cannot reach host H: <ssh's reason>`, exit 1),
//! then run their ranks over ssh (`--launcher-exec` names another
//! ssh-compatible program).
//!
//! Remote ranks reach udrun's PMI server over TCP, in authenticated port
//! mode ([`udbtl_pmi::server`]): each connection must prove it holds the
//! job's secret. udrun listens on the address this host's name resolves
//! to, the one in `PMI_PORT` (`--pmi-listen-any`: every address). A
//! refused connection (no or a wrong proof, a replay, a second claim of a
//! rank, one over the cap of handshakes at once) is no failure of the job:
//! the first three are named (`ignored a PMI_PORT connection: ...`) and,
//! at the end, one line counts them all (`refused 1000 PMI_PORT
//! connections: 990 failed the handshake, 10 came over the cap of
//! handshakes at once; 997 not shown above`). The job key is not derived
//! from the secret: it is in the clear in every datagram, so it is kept
//! the separate random number it was.
//!
//! # Options that shape the ranks
//!
//! `--bind-to core` pins local rank i to the i-th CPU that udrun itself may
//! use, modulo their number, from the rank's first instruction (see
//! [`spawn`]), and says so in one line when there are more local ranks
//! than CPUs; remote ranks are not pinned. `--report-startup`
//! prints `udrun: N ranks, first barrier after T ms`, the time from just
//! before the first spawn to the release of the first PMI barrier.
//!
//! # Exit status
//!
//! 0 when every rank exited 0; else as in the table above; 2 for a bad
//! command line or hostfile, 1 when udrun cannot set the job up.
//! `RUST_LOG` turns on udrun's (and the PMI server's) logs on stderr.

mod cli;
mod events;
mod hosts;
mod job;
mod merge;
mod mpirun;
mod output;
mod rank;
mod remote;
mod spawn;
mod supervise;

use std::fmt;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;

use crate::hosts::HostfileError;

/// Why udrun could not set the job up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The hostfile is unreadable or wrong: exit 2.
    #[error(transparent)]
    Hostfile(#[from] HostfileError),
    /// Remote ranks need this host's name for `PMI_PORT`.
    #[error("cannot tell this host's name, which remote ranks need to reach udrun")]
    NoHostname,
    /// The job's PMI secret could not be made.
    #[error("making the job's PMI secret: {0}")]
    Secret(#[from] udbtl_pmi::SecretError),
    /// The PMI server could not start.
    #[error("starting the PMI server: {0}")]
    Pmi(#[from] udbtl_pmi::ServerError),
    /// A bad command line found after parsing (`-x VAR` with VAR unset):
    /// exit 2.
    #[error("{0}")]
    Usage(String),
    /// The job cannot run as asked (more ranks than slots, than udrun's
    /// limits allow).
    #[error("{0}")]
    Refused(String),
    /// Some other setup step failed.
    #[error("{what}: {}", os_message(source))]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

impl Error {
    fn exit_code(&self) -> u8 {
        match self {
            Self::Hostfile(_) | Self::Usage(_) => 2,
            _ => 1,
        }
    }
}

fn main() -> ExitCode {
    let args = match mpirun::args(std::env::args_os()) {
        Ok(args) => args,
        Err(message) => {
            say(format_args!("{message}"));
            return ExitCode::from(2);
        }
    };
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => return cli::usage(&err),
    };
    init_tracing();
    match job::run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            say(format_args!("{err}"));
            ExitCode::from(err.exit_code())
        }
    }
}

/// Logs to stderr only when `RUST_LOG` asks for it: by default udrun's
/// stderr holds the ranks' output and udrun's own one-line reports.
fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_none() {
        return;
    }
    let filter = tracing_subscriber::EnvFilter::from_default_env();
    // Fails only if a subscriber is already installed, which nothing does.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .try_init();
}

/// Writes one `udrun: ...` line to stderr, under its lock (the ranks' lines
/// are written the same way). A failure to write it is ignored: there is
/// nowhere left to report it.
pub(crate) fn say(message: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "udrun: {message}");
}

/// Sends `signal` to the process group led by `pid`, if there still is one.
pub(crate) fn kill_group(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        // ESRCH: the group is gone already, which is what we want.
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// An I/O error's text without the " (os error N)" that std appends.
pub(crate) fn os_message(err: &io::Error) -> String {
    let text = err.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    }
}
