//! The two stand-in hosts of `scripts/standin/twohosts` (network namespaces
//! udA and udB, 10.77.0.1 on vA and 10.77.0.2 on vB, joined by a veth pair
//! with an MTU of 1500), for the tests of several crates that run a job
//! across them: included with `#[path]`, since tests of different crates
//! share no module otherwise.
//!
//! Needs root and the stand-in host tools. The tests that use them are ignored
//! where the build found either missing (`cfg_attr(any(udbtl_missing =
//! "root", udbtl_missing = "shared_tools"), ignore = ...)`, see
//! udbtl-prereq); where they are missing at run time [`StandInHosts::up`]
//! says `SKIPPED: <reason>`, records it and gives `None`.

use std::path::PathBuf;
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
    /// The hosts, or `None` after saying why the test is skipped (and
    /// recording it).
    pub(crate) fn up() -> Option<Self> {
        use udbtl_prereq::Prereq;
        if let Some(reason) = udbtl_prereq::missing(&[Prereq::Root, Prereq::SharedTools]) {
            udbtl_prereq::skipped!("{reason}");
            return None;
        }
        let tools = udbtl_prereq::shared_tools_dir();
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
