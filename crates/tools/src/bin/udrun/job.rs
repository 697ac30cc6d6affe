//! Setting a job up: where its ranks go (slots, CPUs), a check that the
//! remote hosts answer, the PMI server and its port, and the launch of each
//! rank with its output threads. The [supervisor](crate::supervise) then
//! runs the job to its end.

use std::collections::{HashMap, HashSet};
use std::env;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Instant;

use rustix::process::getpid;
use udbtl_pmi::{JobSecret, Server};

use crate::cli::{BindTo, Cli};
use crate::events::{self, Event};
use crate::hosts::{self, Placement};
use crate::merge::Errors;
use crate::output::{self, Sink};
use crate::spawn::{self, Binder, JobSpec, PortMode};
use crate::supervise::Job;
use crate::{Error, remote, say};

/// Sets up the job, runs it to its end and returns udrun's exit status.
pub(crate) fn run(cli: &Cli) -> Result<u8, Error> {
    let plan = Plan::make(cli)?;
    let (tx, rx) = mpsc::channel();
    let interrupted = Arc::new(AtomicI32::new(0));
    events::watch_signals(tx.clone(), Arc::clone(&interrupted))?;
    let interrupted_by = || interrupted.load(Ordering::Acquire);
    let pmi_host = match reach_remote_hosts(cli, &plan, &interrupted_by)? {
        Ok(host) => host,
        Err(code) => return Ok(code),
    };
    let pmi = Pmi::start(cli, &plan, pmi_host.as_deref(), &tx)?;
    let binder = binder(cli, &plan)?;
    let errors = if cli.tag_output {
        None
    } else {
        Some(Errors::start().map_err(|source| Error::Io {
            what: "starting the stderr thread",
            source,
        })?)
    };
    // Best effort: without it, what a dying rank leaves behind goes to init.
    let _ = rustix::process::set_child_subreaper(Some(getpid()));
    let reaper = events::start_reaper(tx.clone())?;
    let mut job = Job::new(cli, cli.report_startup.then(Instant::now), errors.clone());
    let launch = Launch {
        cli,
        pmi: &pmi,
        binder: binder.as_ref(),
        errors: errors.as_ref(),
        stdin_to_rank_0: events::forward_stdin_wanted(),
        dir: env::current_dir().ok(),
    };
    let mut pids = HashMap::with_capacity(plan.placements.len());
    for (rank, place) in (0..).zip(&plan.placements) {
        if interrupted_by() != 0 || !launch.rank(rank, place, &mut job, &mut pids, &tx) {
            break;
        }
    }
    // The reaper ends only with udrun: the send cannot fail.
    let _ = reaper.send(pids);
    drop(tx);
    watch(&mut job, &rx);
    pmi.server.shutdown();
    if let Some(errors) = &errors {
        errors.flush();
    }
    Ok(job.finish(&pmi.server.stats()))
}

/// Where the ranks go, checked against the slots and CPUs there are.
struct Plan {
    /// Each rank's host and local rank.
    placements: Vec<Placement>,
    /// This machine's name, if it has one.
    this_host: Option<String>,
    /// The CPUs udrun may use.
    cpus: usize,
}

impl Plan {
    fn make(cli: &Cli) -> Result<Self, Error> {
        let hosts = match &cli.hostfile {
            Some(path) => hosts::read_hostfile(path)?,
            None => cli.host.clone(),
        };
        check_exports(cli)?;
        spawn::check_limits(cli.ranks).map_err(Error::Refused)?;
        let oversubscribe = cli.oversubscribe
            || env::var("UDRUN_OVERSUBSCRIBE")
                .is_ok_and(|v| matches!(v.trim(), "1" | "yes" | "true"));
        let cpus = spawn::usable_cpus().map_err(|source| Error::Io {
            what: "reading the CPU affinity mask",
            source,
        })?;
        if !oversubscribe {
            check_slots(cli.ranks, &hosts, cpus)?;
        }
        let this_host = events::hostname();
        let placements = hosts::place(cli.ranks, &hosts, this_host.as_deref());
        Ok(Self {
            placements,
            this_host,
            cpus,
        })
    }

    /// The remote hosts, each once, in order of first use.
    fn remote_hosts(&self) -> Vec<&str> {
        let mut seen = HashSet::new();
        self.placements
            .iter()
            .filter_map(|p| p.host.as_deref())
            .filter(|h| seen.insert(*h))
            .collect()
    }
}

/// Checks that every remote host answers. `Ok(Ok(name))`: the name remote
/// ranks reach this machine by (`None` without remote ranks);
/// `Ok(Err(code))`: stop with `code` (a host did not answer, or udrun was
/// interrupted meanwhile).
fn reach_remote_hosts(
    cli: &Cli,
    plan: &Plan,
    interrupted_by: &dyn Fn() -> i32,
) -> Result<Result<Option<String>, u8>, Error> {
    let remote_hosts = plan.remote_hosts();
    if remote_hosts.is_empty() {
        return Ok(Ok(None));
    }
    let host = plan.this_host.clone().ok_or(Error::NoHostname)?;
    let failed = remote::check_hosts(&cli.launcher_exec, &remote_hosts, || interrupted_by() != 0);
    if let Some(code) = events::interrupted_code(interrupted_by()) {
        return Ok(Err(code));
    }
    if !failed.is_empty() {
        for f in failed {
            say(format_args!("cannot reach host {}: {}", f.host, f.reason));
        }
        return Ok(Err(1));
    }
    Ok(Ok(Some(host)))
}

/// The job's PMI server, its key and secret, and the port remote ranks
/// reach it on.
struct Pmi {
    server: Server,
    key: u32,
    secret_hex: String,
    /// `host:port` of the listener, when some ranks are remote.
    port: Option<String>,
}

impl Pmi {
    /// Starts the server for `plan`'s job, its events forwarded to `tx`,
    /// listening on `pmi_host` (every address with `--pmi-listen-any`)
    /// when some ranks are remote.
    fn start(
        cli: &Cli,
        plan: &Plan,
        pmi_host: Option<&str>,
        tx: &Sender<Event>,
    ) -> Result<Self, Error> {
        let key = spawn::job_key().map_err(|source| Error::Io {
            what: "reading /dev/urandom",
            source,
        })?;
        let kvsname = format!("udrun-{}-{key:08x}", std::process::id());
        let (pmi_tx, pmi_rx) = mpsc::channel();
        let server = Server::new(cli.ranks, kvsname, pmi_tx)?;
        server.set_process_mapping(hosts::process_mapping(&plan.placements));
        if cli.report_startup {
            server.report_barriers();
        }
        events::forward_pmi_events(pmi_rx, tx.clone())?;
        // The job's secret: remote ranks prove it to the PMI port, and
        // every rank keys authenticated datagrams from it.
        let secret = JobSecret::generate()?;
        let secret_hex = secret.to_hex();
        let port = match pmi_host {
            Some(host) => {
                let listening = if cli.pmi_listen_any {
                    server.listen_tcp_authenticated((std::net::Ipv4Addr::UNSPECIFIED, 0), secret)
                } else {
                    server.listen_tcp_authenticated((host, 0), secret)
                };
                let (port, _accepting) = listening.map_err(|e| {
                    if cli.pmi_listen_any {
                        Error::Pmi(e)
                    } else {
                        Error::Refused(format!(
                            "cannot serve PMI on {host}, this host's name, which remote ranks \
                             are told to connect to ({e}); --pmi-listen-any serves it on every \
                             address"
                        ))
                    }
                })?;
                Some(format!("{host}:{port}"))
            }
            None => None,
        };
        Ok(Self {
            server,
            key,
            secret_hex,
            port,
        })
    }
}

/// The CPU binder `--bind-to core` asks for, saying so when local ranks
/// must share CPUs.
fn binder(cli: &Cli, plan: &Plan) -> Result<Option<Binder>, Error> {
    let binder = match cli.bind_to {
        BindTo::Core => Binder::new().map_err(|source| Error::Io {
            what: "reading the CPU affinity mask",
            source,
        })?,
        BindTo::None => return Ok(None),
    };
    let local_size = plan
        .placements
        .iter()
        .find(|p| p.host.is_none())
        .map_or(0, |p| p.local_size);
    let cpus = plan.cpus;
    if local_size as usize > cpus {
        say(format_args!(
            "--bind-to core: {local_size} local ranks on {cpus} CPUs, so they share CPUs \
             (local rank i on the CPU of local rank i mod {cpus})"
        ));
    }
    Ok(Some(binder))
}

/// What starting one rank needs.
struct Launch<'a> {
    cli: &'a Cli,
    pmi: &'a Pmi,
    binder: Option<&'a Binder>,
    errors: Option<&'a Arc<Errors>>,
    stdin_to_rank_0: bool,
    /// The working directory remote ranks start in.
    dir: Option<std::path::PathBuf>,
}

impl Launch<'_> {
    /// Starts rank `rank` at `place`, with its stdin and output threads,
    /// and adds it to `job` and `pids`. Returns whether to go on with the
    /// next rank (a failure has ended the job).
    fn rank(
        &self,
        rank: u32,
        place: &Placement,
        job: &mut Job,
        pids: &mut HashMap<u32, u32>,
        tx: &Sender<Event>,
    ) -> bool {
        let spec = JobSpec {
            argv: &self.cli.command,
            size: self.cli.ranks,
            key: self.pmi.key,
            secret_hex: &self.pmi.secret_hex,
            exports: &self.cli.export,
        };
        let spawned = match &place.host {
            None => spawn::local(
                &spec,
                rank,
                place,
                &self.pmi.server,
                self.binder,
                rank == 0 && self.stdin_to_rank_0,
                tx.clone(),
            )
            .map(|(child, spoke)| (child, Some(spoke))),
            Some(host) => spawn::remote(
                &spec,
                rank,
                place,
                host,
                &self.cli.launcher_exec,
                &PortMode {
                    addr: self.pmi.port.as_deref().unwrap_or(""),
                },
                self.dir.as_deref(),
            )
            .map(|child| (child, None)),
        };
        let (mut child, spoke) = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                job.fail(e.exit_code(), &e.to_string());
                return false;
            }
        };
        pids.insert(child.id(), rank);
        if place.host.is_none() {
            if let Some(to) = child.stdin.take() {
                if let Err(e) = events::forward_stdin(to) {
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
        job.add(child.id(), place, spoke, child.stdin.take());
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
                self.cli.tag_output,
                self.errors.cloned(),
                tx.clone(),
            );
            match forwarded {
                Ok(()) => job.output_opened(rank),
                Err(e) => job.fail(
                    1,
                    &format!(
                        "rank {rank}: cannot start its output thread: {}",
                        crate::os_message(&e)
                    ),
                ),
            }
        }
        !job.is_ending()
    }
}

/// Handles what already happened (a signal that stopped the spawning),
/// then runs the job to its end.
fn watch(job: &mut Job, rx: &Receiver<Event>) {
    while let Ok(event) = rx.try_recv() {
        job.handle(event);
    }
    job.watch(rx);
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
        (
            cpus as u64,
            format!("{cpus} CPU{} here", plural(cpus as u64)),
        )
    } else {
        let slots = hosts::total_slots(hosts);
        (
            slots,
            format!("{slots} slot{} in the host list", plural(slots)),
        )
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

/// "s" unless `n` is 1.
fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
