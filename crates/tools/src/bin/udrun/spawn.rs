//! Starting one rank: its environment, its PMI connection and its CPU.
//!
//! A local rank is served PMI-1 over a socketpair: udrun keeps one end (and
//! hands it to [`Server::serve`]), the rank inherits the other as `PMI_FD`.
//! That end is made inheritable right before the spawn and udrun's copy is
//! closed right after it; ranks are spawned one at a time from one thread
//! and nothing else in udrun starts processes meanwhile, so no other child
//! inherits it. Every rank runs in its own process group, so that killing
//! the group also kills whatever the rank started.
//!
//! `--bind-to core` pins local rank i to the i-th CPU of udrun's own
//! affinity mask (modulo its size) by pinning the spawning thread just
//! before the spawn: the child inherits the mask from its first
//! instruction, so there is no window in which it runs (or starts threads)
//! unpinned, as there would be with `sched_setaffinity(pid)` afterwards.
//! The thread's mask is restored right after.
//!
//! A local rank dies with udrun: it gets SIGKILL when udrun's main thread
//! (the one that spawns every rank and lives as long as udrun) ends, even
//! when udrun itself is killed with SIGKILL (`PR_SET_PDEATHSIG`, set in the
//! child before the exec; a child whose parent is gone by then does not
//! start). What a rank started itself is not covered: only udrun's kill of
//! the rank's process group reaches it.
//!
//! Before anything starts, [`check_limits`] refuses a job that udrun's
//! limits on file descriptors, processes and threads could not hold.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;

use rustix::io::{FdFlags, fcntl_setfd};
use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
use udbtl_pmi::Server;

use crate::cli::Export;
use crate::events::Event;
use crate::hosts::Placement;

/// A random, non-zero job key from the kernel's generator.
pub(crate) fn job_key() -> io::Result<u32> {
    let mut urandom = File::open("/dev/urandom")?;
    loop {
        let mut bytes = [0; 4];
        urandom.read_exact(&mut bytes)?;
        let key = u32::from_ne_bytes(bytes);
        if key != 0 {
            return Ok(key);
        }
    }
}

/// What every rank of the job shares.
#[derive(Debug)]
pub(crate) struct JobSpec<'a> {
    pub(crate) argv: &'a [OsString],
    pub(crate) size: u32,
    pub(crate) key: u32,
    /// The job secret in hex, for `UDBTL_PMI_SECRET`.
    pub(crate) secret_hex: &'a str,
    pub(crate) exports: &'a [Export],
}

impl JobSpec<'_> {
    /// The job's variables for one rank, `-x VAR=VALUE` exports last; the
    /// job key (`UDBTL_JOB_KEY`, `UDRUN_JOB_KEY`) and the job secret
    /// (`UDBTL_PMI_SECRET`) only when `with_secrets`: remote ranks get them
    /// on their launcher's stdin instead. A local rank's environment is
    /// readable by its own user only (`/proc/PID/environ` is mode 0400).
    fn common_env(&self, place: &Placement, with_secrets: bool) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if with_secrets {
            env.push(("UDBTL_JOB_KEY".to_owned(), self.key.to_string()));
            env.push(("UDRUN_JOB_KEY".to_owned(), self.key.to_string()));
            env.push((
                udbtl_pmi::auth::SECRET_ENV.to_owned(),
                self.secret_hex.to_owned(),
            ));
        }
        env.extend([
            ("UDRUN_LOCAL_RANK".to_owned(), place.local_rank.to_string()),
            ("UDRUN_LOCAL_SIZE".to_owned(), place.local_size.to_string()),
        ]);
        env.extend(self.exports.iter().filter_map(|export| {
            let value = export.value.clone();
            value.map(|value| (export.name.clone(), value))
        }));
        env
    }
}

/// Records whether a rank ever sent anything on its PMI connection, so that
/// a program that does not use PMI at all (`udrun -n 2 hostname`) is not
/// taken for one that lost its connection, and tells the main loop the
/// first time it does ([`Event::Spoke`]). Wraps udrun's end of the
/// socketpair.
#[derive(Debug)]
pub(crate) struct Watched {
    stream: UnixStream,
    spoke: Arc<AtomicBool>,
    rank: u32,
    events: Sender<Event>,
}

impl Read for Watched {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream.read(buf)?;
        if n > 0 && !self.spoke.swap(true, Ordering::Relaxed) {
            // Sent before the server handles what was read, so before any
            // of this rank's PMI events.
            let _ = self.events.send(Event::Spoke { rank: self.rank });
        }
        Ok(n)
    }
}

impl Write for Watched {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// Why a rank could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    /// Setting up its PMI connection failed.
    #[error("setting up the PMI connection of rank {rank}: {source}")]
    Pmi {
        rank: u32,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The program (or ssh) did not start.
    #[error("cannot start {}: {}", program.to_string_lossy(), crate::os_message(source))]
    Start {
        program: OsString,
        #[source]
        source: io::Error,
    },
    /// The program exists but rank `rank` could not be started: a resource
    /// ran out (processes, file descriptors, memory, argument space).
    #[error(
        "cannot start rank {rank} ({}): {}",
        program.to_string_lossy(),
        crate::os_message(source)
    )]
    Resource {
        rank: u32,
        program: OsString,
        #[source]
        source: io::Error,
    },
}

impl SpawnError {
    /// The shell's status for a command that cannot run: 127 when it is
    /// not found, 126 when it is not executable, 1 otherwise.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Start { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => 127,
                io::ErrorKind::PermissionDenied => 126,
                _ if source.raw_os_error() == Some(rustix::io::Errno::NOEXEC.raw_os_error()) => 126,
                _ => 1,
            },
            Self::Pmi { .. } | Self::Resource { .. } => 1,
        }
    }

    /// [`Start`](Self::Start) when `source` is about the program itself
    /// (not found, not executable), else [`Resource`](Self::Resource).
    fn starting(rank: u32, program: &std::ffi::OsStr, source: io::Error) -> Self {
        let program = program.to_owned();
        let about_program = matches!(
            source.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
        ) || [
            rustix::io::Errno::NOEXEC,
            rustix::io::Errno::ISDIR,
            rustix::io::Errno::NOTDIR,
        ]
        .iter()
        .any(|e| source.raw_os_error() == Some(e.raw_os_error()));
        if about_program {
            Self::Start { program, source }
        } else {
            Self::Resource {
                rank,
                program,
                source,
            }
        }
    }
}

/// The file descriptors udrun holds per rank: its end of the PMI
/// socketpair (or ssh's stdin), and the stdout and stderr pipes.
const FDS_PER_RANK: u64 = 3;
/// The tasks (processes and threads) udrun's user runs per rank: the rank,
/// its PMI thread and its two output threads.
const TASKS_PER_RANK: u64 = 4;
/// What udrun needs besides: its own descriptors and threads.
const BASE: u64 = 64;

/// Refuses `ranks` ranks when udrun's limits cannot hold them, naming the
/// limit, before anything is started. Raises udrun's soft limit on file
/// descriptors up to its hard limit when the job needs it (ranks inherit
/// the raised limit).
pub(crate) fn check_limits(ranks: u32) -> Result<(), String> {
    use rustix::process::{Resource, getrlimit, getuid, setrlimit};
    let ranks_n = u64::from(ranks);
    let fds = FDS_PER_RANK * ranks_n + BASE;
    let nofile = getrlimit(Resource::Nofile);
    let hard = nofile.maximum.unwrap_or(u64::MAX);
    if fds > hard {
        return Err(format!(
            "-n {ranks} needs about {fds} file descriptors in udrun ({FDS_PER_RANK} per rank), \
             over its limit of {hard} (RLIMIT_NOFILE, ulimit -n)"
        ));
    }
    if nofile.current.is_some_and(|soft| fds > soft) {
        let raised = rustix::process::Rlimit {
            current: nofile.maximum,
            maximum: nofile.maximum,
        };
        setrlimit(Resource::Nofile, raised).map_err(|e| {
            format!(
                "-n {ranks} needs about {fds} file descriptors in udrun; raising \
                 RLIMIT_NOFILE to {hard} failed: {}",
                crate::os_message(&e.into())
            )
        })?;
    }
    let tasks = TASKS_PER_RANK * ranks_n + BASE;
    let what = format!(
        "-n {ranks} needs about {tasks} processes and threads (a process and 3 threads per rank)"
    );
    // root is not held to RLIMIT_NPROC.
    if !getuid().is_root() {
        if let Some(limit) = getrlimit(Resource::Nproc).current.filter(|&l| tasks > l) {
            return Err(format!(
                "{what}, over the limit of {limit} (RLIMIT_NPROC, ulimit -u)"
            ));
        }
    }
    for knob in ["threads-max", "pid_max"] {
        let value = std::fs::read_to_string(format!("/proc/sys/kernel/{knob}"))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(limit) = value.filter(|&l| tasks > l) {
            return Err(format!(
                "{what}, over the system's limit of {limit} (kernel.{knob})"
            ));
        }
    }
    Ok(())
}

/// The number of CPUs udrun may run on (its affinity mask).
pub(crate) fn usable_cpus() -> io::Result<usize> {
    let set = sched_getaffinity(None)?;
    Ok(set.count() as usize)
}

/// CPU pinning for `--bind-to core`.
#[derive(Debug)]
pub(crate) struct Binder {
    /// The spawning thread's own mask, restored after each spawn.
    original: CpuSet,
    /// The CPUs in `original`, in increasing order.
    cpus: Vec<usize>,
}

impl Binder {
    /// Reads the calling thread's mask.
    pub(crate) fn new() -> io::Result<Self> {
        let original = sched_getaffinity(None)?;
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&c| original.is_set(c))
            .collect();
        if cpus.is_empty() {
            return Err(io::Error::other("the affinity mask is empty"));
        }
        Ok(Self { original, cpus })
    }

    /// The CPU of local rank `local_rank`.
    pub(crate) fn cpu(&self, local_rank: u32) -> usize {
        self.cpus[local_rank as usize % self.cpus.len()]
    }
}

/// Spawns local rank `rank`, served by `server` over a new socketpair, with
/// its stdout and stderr piped and stdin piped when `stdin` (else from
/// /dev/null). Returns the child and the flag that tells whether it spoke
/// PMI; `events` hears when it first does. Must be called from udrun's
/// main thread (see the [module docs](self)).
pub(crate) fn local(
    job: &JobSpec<'_>,
    rank: u32,
    place: &Placement,
    server: &Server,
    binder: Option<&Binder>,
    stdin: bool,
    events: Sender<Event>,
) -> Result<(Child, Arc<AtomicBool>), SpawnError> {
    let pmi = |source: Box<dyn std::error::Error + Send + Sync>| SpawnError::Pmi { rank, source };
    let (ours, theirs) = UnixStream::pair().map_err(|e| pmi(e.into()))?;
    let spoke = Arc::new(AtomicBool::new(false));
    let watched = Watched {
        stream: ours,
        spoke: Arc::clone(&spoke),
        rank,
        events,
    };
    // The serving thread starts before any pinning, so it keeps udrun's mask.
    server.serve(watched, rank).map_err(|e| pmi(e.into()))?;

    let mut cmd = Command::new(&job.argv[0]);
    cmd.args(&job.argv[1..])
        .env_remove("PMI_PORT")
        .env_remove("PMI_ID")
        .env("PMI_FD", theirs.as_raw_fd().to_string())
        .env("PMI_RANK", rank.to_string())
        .env("PMI_SIZE", job.size.to_string())
        .envs(job.common_env(place, true))
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    die_with_udrun(&mut cmd);

    fcntl_setfd(&theirs, FdFlags::empty()).map_err(|e| pmi(Box::new(io::Error::from(e))))?;
    if let Some(binder) = binder {
        let mut set = CpuSet::new();
        set.set(binder.cpu(place.local_rank));
        sched_setaffinity(None, &set).map_err(|e| pmi(Box::new(io::Error::from(e))))?;
    }
    let spawned = cmd.spawn();
    if let Some(binder) = binder {
        // Cannot fail: the mask is the one this thread had.
        let _ = sched_setaffinity(None, &binder.original);
    }
    drop(theirs);
    let child = spawned.map_err(|source| SpawnError::starting(rank, &job.argv[0], source))?;
    Ok((child, spoke))
}

/// Makes the child get SIGKILL when the calling thread (udrun's main
/// thread) ends, and not start at all if udrun is already gone.
#[allow(unsafe_code)]
fn die_with_udrun(cmd: &mut Command) {
    let udrun = rustix::process::getpid();
    let hook = move || {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
        // udrun died before the prctl: the signal will never come.
        if rustix::process::getppid() != Some(udrun) {
            return Err(io::Error::from(rustix::io::Errno::SRCH));
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and makes only
    // two raw system calls (prctl, getppid) through rustix, and builds its
    // errors from OS error numbers: no allocation, no lock, nothing that is
    // unsafe after a fork in a threaded process.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Where a remote rank's PMI connection goes, and what it must prove.
#[derive(Debug)]
pub(crate) struct PortMode<'a> {
    /// `host:port`, the rank's `PMI_PORT`.
    pub(crate) addr: &'a str,
}

/// Spawns remote rank `rank` through `launcher` (ssh): its PMI connection
/// comes back to `pmi.addr`. stdin, stdout and stderr are pipes; the job
/// secret and key are written into stdin at once (see
/// [`remote`](crate::remote#secrets)), and stdin must then stay open for
/// as long as the rank may run.
pub(crate) fn remote(
    job: &JobSpec<'_>,
    rank: u32,
    place: &Placement,
    host: &str,
    launcher: &std::ffi::OsStr,
    pmi: &PortMode<'_>,
    dir: Option<&std::path::Path>,
) -> Result<Child, SpawnError> {
    let mut env = vec![
        ("PMI_PORT".to_owned(), pmi.addr.to_owned()),
        ("PMI_ID".to_owned(), rank.to_string()),
    ];
    env.extend(job.common_env(place, false));
    // `-x VAR` without a value sends udrun's own value (if it has one).
    env.extend(
        job.exports
            .iter()
            .filter(|e| e.value.is_none())
            .filter_map(|e| {
                std::env::var(&e.name)
                    .ok()
                    .map(|value| (e.name.clone(), value))
            }),
    );
    let command = crate::remote::command(dir, &env, job.argv);
    let mut child = crate::remote::launcher(launcher, host, &command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SpawnError::starting(rank, launcher, source))?;
    if let Some(stdin) = child.stdin.as_mut() {
        // Far less than a pipe's buffer: this does not block. It fails only
        // when the launcher is gone already (EPIPE), whose exit udrun
        // reports; the remote side, without the line, exits 1 saying so.
        let _ = stdin.write_all(crate::remote::secrets_line(job.secret_hex, job.key).as_bytes());
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_keys_are_random_and_non_zero() {
        let a = job_key().unwrap();
        let b = job_key().unwrap();
        assert_ne!(a, 0);
        assert_ne!(a, b, "two keys in a row collided (p = 2^-32)");
    }

    #[test]
    fn spawn_errors_map_to_shell_codes() {
        let start = |kind: io::Error| SpawnError::Start {
            program: "p".into(),
            source: kind,
        };
        assert_eq!(start(io::ErrorKind::NotFound.into()).exit_code(), 127);
        assert_eq!(
            start(io::ErrorKind::PermissionDenied.into()).exit_code(),
            126
        );
        assert_eq!(start(io::Error::from_raw_os_error(8)).exit_code(), 126);
        assert_eq!(start(io::ErrorKind::OutOfMemory.into()).exit_code(), 1);
        assert_eq!(
            start(io::Error::from_raw_os_error(2)).to_string(),
            "cannot start p: No such file or directory"
        );
    }
}
