//! Running MPI programs over the component: finding Open MPI, building the
//! component's folder and the test programs, and launching `mpirun`.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

/// `mpirun` of Open MPI (Debian installs it beside MPICH's).
pub const MPIRUN: &str = "mpirun.openmpi";
/// Open MPI's C compiler wrapper.
pub const MPICC: &str = "mpicc.openmpi";

/// Why Open MPI cannot be used here, or `None` when it can. Tests print
/// `SKIPPED: <reason>` and return; CI installs Open MPI, so there they run.
pub fn unavailable() -> Option<String> {
    for tool in [MPIRUN, MPICC] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Some(format!(
                "{tool} not found (apt-get install openmpi-bin libopenmpi-dev)"
            ));
        }
    }
    None
}

/// Returns early from a test, saying SKIPPED, when Open MPI is missing.
#[macro_export]
macro_rules! require_openmpi {
    () => {
        if let Some(reason) = common::unavailable() {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

/// The profile folder (`target/debug`) of the running test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// A folder holding `mca_btl_udbtl.so`, for `mca_base_component_path`.
/// Cargo names the library `libmca_btl_udbtl.so`; Open MPI looks for
/// `mca_btl_udbtl.so`.
pub fn component_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let profile = profile_dir();
        let dir = profile.join("ompi-component");
        std::fs::create_dir_all(&dir).expect("create component folder");
        let built = profile.join("libmca_btl_udbtl.so");
        assert!(built.exists(), "{} was not built", built.display());
        let tmp = dir.join(format!(".mca_btl_udbtl.so.{}", std::process::id()));
        std::fs::copy(&built, &tmp).expect("copy the component");
        std::fs::rename(&tmp, dir.join("mca_btl_udbtl.so")).expect("install the component");
        dir
    })
}

/// Open MPI's own component folder (`ompi_info --path pkglibdir`).
pub fn default_component_dir() -> &'static str {
    static DIR: OnceLock<String> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("ompi_info")
            .args(["--path", "pkglibdir", "--parsable"])
            .output()
            .expect("run ompi_info");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix("path:pkglibdir:"))
            .map(str::trim)
            .unwrap_or("/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3")
            .to_owned()
    })
}

/// `OMPI_MCA_mca_base_component_path` that finds the component and keeps
/// Open MPI's own.
pub fn component_path() -> String {
    format!("{}:{}", component_dir().display(), default_component_dir())
}

/// Compiles `tests/programs/<name>.c` (once per test binary) and returns the
/// executable.
pub fn program(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    let out_dir = profile_dir().join("ompi-programs");
    std::fs::create_dir_all(&out_dir).expect("create program folder");
    let exe = out_dir.join(name);
    let fresh = match (std::fs::metadata(&exe), std::fs::metadata(&src)) {
        (Ok(e), Ok(s)) => e.modified().ok() >= s.modified().ok(),
        _ => false,
    };
    if !fresh {
        let tmp = out_dir.join(format!(".{name}.{}", std::process::id()));
        let out = Command::new(MPICC)
            .args(["-O2", "-Wall", "-Werror", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .expect("run mpicc");
        assert!(
            out.status.success(),
            "mpicc {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &exe).expect("install program");
    }
    exe
}

/// One `mpirun` launch.
#[derive(Debug, Clone)]
pub struct Run {
    /// Ranks.
    pub np: u32,
    /// The `btl` selection, e.g. `self,udbtl`.
    pub btl: String,
    /// Extra `mpirun` arguments, before the program.
    pub mpirun_args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Killed (and the test failed) after this long.
    pub limit: Duration,
}

impl Run {
    /// `np` ranks, every peer through udbtl (`self,udbtl`), with the
    /// component's counters printed at finalize.
    pub fn udbtl(np: u32) -> Self {
        Self {
            np,
            btl: "self,udbtl".into(),
            mpirun_args: vec!["--mca".into(), "btl_udbtl_print_stats".into(), "1".into()],
            env: Vec::new(),
            limit: Duration::from_secs(120),
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Adds `--mca name value`.
    pub fn mca(mut self, name: &str, value: &str) -> Self {
        self.mpirun_args
            .extend(["--mca".into(), name.into(), value.into()]);
        self
    }

    /// The command, ready to run `exe args`.
    pub fn command(&self, exe: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new("timeout");
        cmd.args(["-k", "5", &self.limit.as_secs().to_string(), MPIRUN])
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "none",
            ])
            .args(["-np", &self.np.to_string()])
            .args(["--mca", "pml", "ob1", "--mca", "btl", &self.btl])
            .args(["--mca", "oob_tcp_if_include", "lo"])
            .args(["--mca", "btl_tcp_if_include", "lo"])
            .args(&self.mpirun_args)
            .arg(exe)
            .args(args)
            .env("OMPI_MCA_mca_base_component_path", component_path())
            // PMIx's munge security plugin is kept out: without a munge
            // daemon it retries for over two seconds at every launch.
            .env("PMIX_MCA_psec", "^munge")
            .env_remove("OMPI_MCA_btl")
            .env_remove("OMPI_MCA_pml");
        for (key, _) in std::env::vars() {
            if key.starts_with("UDBTL_") {
                cmd.env_remove(key);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs `exe args` and returns what it printed.
    pub fn output(&self, exe: &Path, args: &[&str]) -> Output {
        self.command(exe, args).output().expect("run mpirun")
    }

    /// Runs `exe args`, asserts success, and returns the output.
    pub fn success(&self, exe: &Path, args: &[&str]) -> Output {
        let out = self.output(exe, args);
        assert!(
            out.status.success(),
            "{} {:?} with {:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            exe.display(),
            args,
            self,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// One rank's counters, from the `udbtl-stats:` line each process prints at
/// finalize with `btl_udbtl_print_stats` set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub rank: u32,
    pub sent: u64,
    pub received: u64,
    pub retransmitted: u64,
    pub lost_peers: u64,
}

/// Every `udbtl-stats:` line in `stderr`.
pub fn stats(stderr: &[u8]) -> Vec<Stats> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|line| line.split_once("udbtl-stats:").map(|(_, rest)| rest))
        .map(|rest| {
            let mut stats = Stats::default();
            for field in rest.split_whitespace() {
                let Some((key, value)) = field.split_once('=') else {
                    continue;
                };
                let value: u64 = value.parse().unwrap_or(0);
                match key {
                    "rank" => stats.rank = value as u32,
                    "sent" => stats.sent = value,
                    "received" => stats.received = value,
                    "retransmitted" => stats.retransmitted = value,
                    "lost_peers" => stats.lost_peers = value,
                    _ => {}
                }
            }
            stats
        })
        .collect()
}

/// Asserts that udbtl carried traffic on every one of `np` ranks (when
/// `np > 1`): each printed its counters, and each sent and received.
pub fn assert_carried(out: &Output, np: u32) {
    let all = stats(&out.stderr);
    assert_eq!(
        all.len(),
        np as usize,
        "expected one udbtl-stats line per rank:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if np > 1 {
        for s in &all {
            assert!(
                s.sent > 0 && s.received > 0,
                "rank {} moved nothing over udbtl: {s:?}",
                s.rank
            );
        }
    }
}
