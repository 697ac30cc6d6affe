//! One rank as the supervisor sees it: its process, where it runs, and
//! how far it got with PMI.

use std::ffi::OsString;
use std::process::ChildStdin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::events::Status;

/// One rank as the main loop sees it.
#[derive(Debug)]
pub(crate) struct Rank {
    pub(crate) pid: u32,
    /// The remote host, `None` when local.
    pub(crate) host: Option<String>,
    /// Whether a local rank ever sent anything on PMI; `None` for a remote
    /// rank, whose PMI connection exists only if it used PMI.
    pub(crate) spoke: Option<Arc<AtomicBool>>,
    /// A remote rank's ssh stdin: closing it kills the remote side.
    pub(crate) stdin: Option<ChildStdin>,
    /// The launcher program of a remote rank (ssh, or `--launcher-exec`).
    pub(crate) launcher: Option<OsString>,
    pub(crate) exit: Option<Status>,
    /// A local rank's PMI connection has not ended yet (as far as the main
    /// loop knows).
    pub(crate) pmi_open: bool,
    /// A remote rank completed its PMI handshake.
    pub(crate) connected: bool,
    pub(crate) finalized: bool,
    pub(crate) disconnected: bool,
    /// Its exit waits for the end of its PMI connection before it is judged.
    pub(crate) judging: bool,
    /// Its output pipes still forwarded (not yet at their end).
    pub(crate) outputs: u8,
}

impl Rank {
    pub(crate) fn spoke(&self) -> bool {
        self.spoke
            .as_ref()
            .is_none_or(|spoke| spoke.load(Ordering::Relaxed))
    }

    /// Whether it reached PMI: a local rank sent something on its socket,
    /// a remote one completed the handshake.
    pub(crate) fn reached_pmi(&self) -> bool {
        match &self.spoke {
            Some(spoke) => spoke.load(Ordering::Relaxed),
            None => self.connected,
        }
    }

    /// "pid 123" or "host h, ssh pid 123" (the launcher's name).
    pub(crate) fn who(&self) -> String {
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
