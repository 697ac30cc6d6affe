//! The two stand-in hosts of `scripts/standin/twohosts` (network namespaces
//! udA and udB, 10.77.0.1 on vA and 10.77.0.2 on vB, joined by a veth pair
//! with an MTU of 1500), for the tests of several crates that run a job
//! across them: included with `#[path]`, since tests of different crates
//! share no module otherwise.
//!
//! Needs root and the shared tools; [`StandInHosts::up`] says `SKIPPED:
//! <reason>` and gives `None` otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The namespaces, brought up if they were not, and left up: a test
/// process cannot know whether another (a second `cargo test`, another
/// crate's tests) still runs in them. Tests of one binary take them one at
/// a time, so that their jobs do not crowd each other.
pub(crate) struct StandInHosts {
    tools: PathBuf,
    _turn: MutexGuard<'static, ()>,
}

impl StandInHosts {
    /// The hosts, or `None` after saying why the test is skipped.
    pub(crate) fn up() -> Option<Self> {
        let tools = match shared_tools() {
            Ok(tools) => tools,
            Err(reason) => {
                eprintln!("SKIPPED: {reason}");
                return None;
            }
        };
        static TURN: Mutex<()> = Mutex::new(());
        let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        // `twohosts up` first takes the hosts down, and they are usable only
        // once it wrote their hosts files: the check and the bring-up happen
        // under one lock that every test process takes.
        let status = Command::new("flock")
            .arg(std::env::temp_dir().join("udbtl-stand-in-hosts.lock"))
            .args(["sh", "-c", BRING_UP_UNLESS_PRESENT])
            .arg(tools.join("twohosts"))
            .status()
            .expect("run flock");
        assert!(status.success(), "twohosts up failed: {status}");
        Some(Self { tools, _turn: turn })
    }

    /// The `ssh` stand-in: `nsssh HOST COMMAND` runs COMMAND in namespace
    /// HOST.
    pub(crate) fn nsssh(&self) -> PathBuf {
        self.tools.join("nsssh")
    }

    /// `cmd` to run inside udA, with its environment.
    pub(crate) fn in_a(&self, cmd: &Command) -> Command {
        let mut wrapped = Command::new("ip");
        wrapped
            .args(["netns", "exec", "udA"])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
    }
}

/// Runs `$0 up` (`$0` is twohosts) unless both namespaces exist with their
/// hosts files, which `twohosts up` writes last.
const BRING_UP_UNLESS_PRESENT: &str = "for h in udA udB; do \
     [ -e /run/netns/$h ] && [ -f /etc/netns/$h/hosts ] || exec \"$0\" up; \
     done";

/// The folder of `twohosts` and `nsssh`, or why a test cannot use them.
fn shared_tools() -> Result<PathBuf, String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| format!("id -u: {e}"))?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("the stand-in hosts need root (network namespaces)".into());
    }
    let tools = std::env::var_os("UDBTL_SHARED_TOOLS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/standin"),
        PathBuf::from,
    );
    for tool in ["twohosts", "nsssh"] {
        if !tools.join(tool).is_file() {
            return Err(format!(
                "{} not found (set UDBTL_SHARED_TOOLS to the folder holding twohosts and nsssh)",
                tools.join(tool).display()
            ));
        }
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Err("ip (iproute2) is not installed".into());
    }
    if Command::new("flock").arg("-V").output().is_err() {
        return Err("flock (util-linux) is not installed".into());
    }
    Ok(tools)
}
