//! What happens to a job, as events on one channel, and the threads that
//! produce them: signals, the PMI server's events, the reaper, and the
//! copy of udrun's stdin to rank 0.

use std::collections::HashMap;
use std::io::{self, IsTerminal};
use std::process::ChildStdin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;

use rustix::io::Errno;
use rustix::process::WaitOptions;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;
use udbtl_pmi::ServerEvent;

use crate::{Error, say};

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
    /// One forwarded output pipe of `rank` reached its end (or its
    /// forwarding stopped).
    OutputClosed { rank: u32 },
    /// udrun's stdout or stderr was closed by its reader: sent before the
    /// rank's pipe is closed, so before the rank can fail for it.
    OutputGone,
    /// udrun has no child left at all.
    NoChildren,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Code(i32),
    Signal(i32),
}

/// Whether to forward udrun's stdin to rank 0: not when it is a terminal
/// that udrun does not own (udrun runs in the background), where reading
/// it would stop udrun.
pub(crate) fn forward_stdin_wanted() -> bool {
    let stdin = io::stdin();
    if !stdin.is_terminal() {
        return true;
    }
    rustix::termios::tcgetpgrp(&stdin).is_ok_and(|pgrp| pgrp == rustix::process::getpgrp())
}

/// Copies udrun's stdin to rank 0's until either ends; then rank 0 sees
/// the end of its input.
pub(crate) fn forward_stdin(mut to: ChildStdin) -> io::Result<()> {
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
pub(crate) fn interrupted_code(signal: i32) -> Option<u8> {
    (signal != 0).then(|| {
        say(format_args!("interrupted by {}", signal_name(signal)));
        exit_code_for_signal(signal)
    })
}

/// This machine's name, as remote ranks are told to reach it.
pub(crate) fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// Turns SIGINT, SIGTERM, SIGHUP and SIGQUIT into [`Event::Signal`]s (and
/// records the first in `interrupted`, which stops the spawning).
pub(crate) fn watch_signals(tx: Sender<Event>, interrupted: Arc<AtomicI32>) -> Result<(), Error> {
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
pub(crate) fn forward_pmi_events(
    events: Receiver<ServerEvent>,
    tx: Sender<Event>,
) -> Result<(), Error> {
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
pub(crate) fn start_reaper(tx: Sender<Event>) -> Result<Sender<HashMap<u32, u32>>, Error> {
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

/// 128 + `signal`, as a shell reports a death by signal.
pub(crate) fn exit_code_for_signal(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(1, 127)).unwrap_or(u8::MAX)
}

/// The exit status for `PMI_Abort(code)`: the code modulo 256, but never 0
/// for a job that was killed.
pub(crate) fn abort_exit_code(code: i32) -> u8 {
    match u8::try_from(code.rem_euclid(256)) {
        Ok(0) | Err(_) => 1,
        Ok(code) => code,
    }
}

/// `SIGSEGV` for 11, and so on (Linux numbering).
pub(crate) fn signal_name(signal: i32) -> String {
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
