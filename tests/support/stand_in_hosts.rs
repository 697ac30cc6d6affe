//! The two stand-in hosts of `shared/tools/twohosts` (network namespaces
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

/// The namespaces, brought up if they were not and taken down again only
/// then (another user may be running in namespaces it brought up). Tests
/// of one binary hold them one at a time: one test's teardown must not pull
/// them from under another.
pub(crate) struct StandInHosts {
    tools: PathBuf,
    brought_up: bool,
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
        let list = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        let list = String::from_utf8_lossy(&list.stdout);
        let present = |name: &str| {
            list.lines()
                .any(|l| l.split_whitespace().next() == Some(name))
        };
        let brought_up = !(present("udA") && present("udB"));
        if brought_up {
            let status = Command::new(tools.join("twohosts"))
                .arg("up")
                .status()
                .expect("run twohosts up");
            assert!(status.success(), "twohosts up failed: {status}");
        }
        Some(Self {
            tools,
            brought_up,
            _turn: turn,
        })
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

impl Drop for StandInHosts {
    fn drop(&mut self) {
        if self.brought_up {
            let _ = Command::new(self.tools.join("twohosts"))
                .arg("down")
                .status();
        }
    }
}

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
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools"),
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
    Ok(tools)
}
