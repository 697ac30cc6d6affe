//! Running MPI programs over the component: finding Open MPI, building the
//! component's folder and the test programs, and launching `mpirun`.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

pub mod nobody;

/// `mpirun` of Open MPI (Debian installs it beside MPICH's). udbtl-prereq's
/// `Prereq::OpenMpi` looks for the same two names.
pub const MPIRUN: &str = "mpirun.openmpi";
/// Open MPI's C compiler wrapper.
pub const MPICC: &str = "mpicc.openmpi";

/// Returns early from a test when Open MPI is missing at run time, saying
/// `SKIPPED: <reason>` and recording it (see udbtl-prereq's `require!`).
///
/// Every test that uses it also carries `#[cfg_attr(udbtl_missing =
/// "openmpi", ignore = "SKIPPED: ...")]`: where the build found Open MPI
/// missing, it is ignored and this never runs. CI installs Open MPI, so
/// there they run.
#[macro_export]
macro_rules! require_openmpi {
    () => {
        udbtl_prereq::require!(udbtl_prereq::Prereq::OpenMpi);
    };
}

/// One `mpirun` at a time from a test binary: the machine may have 2 CPUs,
/// and several 8-rank jobs at once would starve each other into timeouts.
/// Some tests also find their processes by command line and measure time.
/// A test that panicked while holding the turn does not stop the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static LAUNCH: Mutex<()> = Mutex::new(());
    LAUNCH.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The profile folder (`target/debug`) of the running test binary.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// A folder holding `mca_btl_udbtl.so`, for `mca_base_component_path`.
///
/// Cargo builds only the rlib for integration tests, so the cdylib in
/// `target/<profile>` may be missing or stale: the component is built and
/// installed here, once per test binary, by `scripts/ompi-component` (the
/// script users run), into a target folder of its own
/// (`target/ompi-component-build`: the outer cargo holds the lock of its
/// own).
pub fn component_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let started = std::time::Instant::now();
        let out = ompi_component_script()
            .output()
            .expect("run scripts/ompi-component");
        assert!(
            out.status.success(),
            "scripts/ompi-component failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = component_path_from(&stdout)
            .expect("scripts/ompi-component printed the component path");
        let dir = PathBuf::from(path.split(':').next().unwrap_or_default());
        assert!(
            dir.join("mca_btl_udbtl.so").is_file(),
            "{} holds no mca_btl_udbtl.so",
            dir.display()
        );
        eprintln!(
            "built the component ({}) in {:?}",
            dir.display(),
            started.elapsed()
        );
        dir
    })
}

/// `scripts/ompi-component`, ready to run as the tests run it: the profile
/// of the test binary, into `<target>/ompi-component-build`, with the cargo
/// that runs the tests.
pub fn ompi_component_script() -> Command {
    let profile = profile_dir();
    let target = profile
        .parent()
        .expect("target folder")
        .join("ompi-component-build");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(workspace.join("scripts/ompi-component"));
    let release = profile.file_name().is_some_and(|n| n == "release");
    if !release {
        cmd.arg("--debug");
    }
    // Tests fetch nothing: the outer build already has every crate.
    cmd.env("CARGO_TARGET_DIR", &target)
        .env("CARGO_NET_OFFLINE", "true");
    // The cargo running the tests comes first on the PATH.
    if let Some(cargo_dir) = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .and_then(|c| c.parent().map(Path::to_path_buf))
    {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs = std::iter::once(cargo_dir).chain(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(dirs) {
            cmd.env("PATH", joined);
        }
    }
    cmd
}

/// The value of `OMPI_MCA_mca_base_component_path` in the script's output
/// (`export OMPI_MCA_mca_base_component_path=DIR:DEFAULT`).
pub fn component_path_from(stdout: &str) -> Option<&str> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("export OMPI_MCA_mca_base_component_path="))
        .map(str::trim)
        .filter(|p| !p.is_empty())
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

/// Compiles `tests/programs/<name>.c` (when the executable is older than
/// the source) and returns the executable.
///
/// Safe from any thread and process: one build at a time per test binary
/// (so the threads after the first find the program fresh), each into a
/// temporary file named by process and thread, renamed into place.
pub fn program(name: &str) -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let _build = BUILD.lock().unwrap_or_else(PoisonError::into_inner);
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
        // "ThreadId(7)" -> "7"
        let thread: String = format!("{:?}", std::thread::current().id())
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        let tmp = out_dir.join(format!(".{name}.{}.{thread}", std::process::id()));
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
    /// The interface (name or subnet) for the out-of-band channel and the tcp
    /// BTL: `oob_tcp_if_include` and `btl_tcp_if_include`. `lo` by default
    /// (this machine's eth0 must not be used); `None` leaves Open MPI's
    /// defaults, as across the stand-in hosts, which have no eth0.
    pub oob_if: Option<String>,
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
            oob_if: Some("lo".into()),
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
            .args(self.oob_if.iter().flat_map(|i| {
                [
                    "--mca",
                    "oob_tcp_if_include",
                    i,
                    "--mca",
                    "btl_tcp_if_include",
                    i,
                ]
            }))
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

/// The `key=value` fields of every `udbtl-stats:` line in `stderr`, one
/// list per line (per rank).
pub fn stats_fields(stderr: &[u8]) -> Vec<Vec<(String, String)>> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|line| line.split_once("udbtl-stats:").map(|(_, rest)| rest))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|field| field.split_once('='))
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect()
        })
        .collect()
}

/// Each rank's counters from the `udbtl-stats:` lines in `stderr`, summed
/// over its modules (a rank prints one line per module: loopback for the
/// peers on its host, an interface for the others), in rank order.
pub fn stats(stderr: &[u8]) -> Vec<Stats> {
    let mut ranks: Vec<Stats> = Vec::new();
    for fields in stats_fields(stderr) {
        let mut line = Stats::default();
        for (key, value) in &fields {
            let value: u64 = value.parse().unwrap_or(0);
            match key.as_str() {
                "rank" => line.rank = value as u32,
                "sent" => line.sent = value,
                "received" => line.received = value,
                "retransmitted" => line.retransmitted = value,
                "lost_peers" => line.lost_peers = value,
                _ => {}
            }
        }
        match ranks.iter_mut().find(|s| s.rank == line.rank) {
            Some(rank) => {
                rank.sent += line.sent;
                rank.received += line.received;
                rank.retransmitted += line.retransmitted;
                rank.lost_peers += line.lost_peers;
            }
            None => ranks.push(line),
        }
    }
    ranks.sort_by_key(|s| s.rank);
    ranks
}

/// Sum over the ranks' `udbtl-stats:` lines of the counter `key` (for the
/// counters [`Stats`] does not carry).
pub fn total(out: &Output, key: &str) -> u64 {
    stats_fields(&out.stderr)
        .iter()
        .flatten()
        .filter(|(k, _)| k == key)
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum()
}

/// Asserts that some rank counted `key` (its [`total`] is above 0).
pub fn assert_counted(out: &Output, key: &str) {
    assert!(
        total(out, key) > 0,
        "no rank counted {key}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that no rank counted `key` (its [`total`] is 0).
pub fn assert_never_counted(out: &Output, key: &str) {
    let sum = total(out, key);
    assert_eq!(
        sum,
        0,
        "the ranks counted {key} {sum} times:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that udbtl carried traffic on every one of `np` ranks (when
/// `np > 1`): each printed its counters, with the fabric's drops among
/// them, and each sent and received.
pub fn assert_carried(out: &Output, np: u32) {
    let all = stats(&out.stderr);
    assert_eq!(
        all.len(),
        np as usize,
        "expected udbtl-stats lines from every rank:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for fields in stats_fields(&out.stderr) {
        for key in ["tx_refused", "socket_full", "missing_piece"] {
            assert!(
                fields
                    .iter()
                    .any(|(k, v)| k == key && v.parse::<u64>().is_ok()),
                "a udbtl-stats line without {key}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
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

/// Asserts that `name` printed its `OK <name>` line; `with` says how it was
/// run (e.g. `3 ranks`), for the message.
pub fn assert_said_ok(name: &str, out: &Output, with: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().any(|l| l.starts_with(&format!("OK {name}"))),
        "{name} with {with} did not say OK:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds `name` and runs it on `run`, one launch at a time ([`serial`]).
/// Asserts success, the program's `OK <name>` line and udbtl's traffic.
pub fn run_ok(name: &str, run: &Run, args: &[&str]) -> Output {
    let exe = program(name);
    let _turn = serial();
    let out = run.success(&exe, args);
    assert_said_ok(name, &out, &format!("{} ranks", run.np));
    assert_carried(&out, run.np);
    out
}

/// A size as Open MPI prints it: a number, maybe with a K, M or G suffix.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().last()? {
        (i, 'k' | 'K') => (&text[..i], 1 << 10),
        (i, 'm' | 'M') => (&text[..i], 1 << 20),
        (i, 'g' | 'G') => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok().map(|n| n * unit)
}

/// The thresholds ob1 switches protocol at: the component's
/// `btl_udbtl_{eager_limit,rndv_eager_limit,max_send_size}`.
///
/// They come from `ompi_info` when the component registers them as MCA
/// parameters; otherwise from its own `udbtl-stats:` line (which reports the
/// limits it gave ob1) after a small run; otherwise from `defaults`. Any
/// source may lack some of them.
pub fn thresholds(defaults: [u64; 3]) -> [u64; 3] {
    const NAMES: [&str; 3] = ["eager_limit", "rndv_eager_limit", "max_send_size"];
    let mut found: [Option<u64>; 3] = [None; 3];

    let info = Command::new("ompi_info")
        .args(["--param", "btl", "udbtl", "--level", "9", "--parsable"])
        .env("OMPI_MCA_mca_base_component_path", component_path())
        .output()
        .expect("run ompi_info");
    for line in String::from_utf8_lossy(&info.stdout).lines() {
        for (i, name) in NAMES.iter().enumerate() {
            let key = format!("mca:btl:udbtl:param:btl_udbtl_{name}:value:");
            // 0 is the component's "automatic": the value comes from the run.
            if let Some(value) = line.strip_prefix(&key) {
                found[i] = found[i].or(parse_size(value).filter(|v| *v > 0));
            }
        }
    }

    if found.iter().any(Option::is_none) {
        let exe = program("hello");
        let out = {
            let _turn = serial();
            Run::udbtl(2).output(&exe, &[])
        };
        for (key, value) in stats_fields(&out.stderr).iter().flatten() {
            if let Some(i) = NAMES.iter().position(|n| n == key) {
                found[i] = found[i].or(parse_size(value));
            }
        }
    }

    let mut limits = defaults;
    for (limit, value) in limits.iter_mut().zip(found) {
        if let Some(value) = value.filter(|v| *v > 0) {
            *limit = value;
        }
    }
    limits
}

/// The component's thresholds, looked up once per test binary, as
/// arguments for `p2p`.
pub fn threshold_args() -> &'static [String] {
    static ARGS: OnceLock<Vec<String>> = OnceLock::new();
    ARGS.get_or_init(|| {
        let limits = thresholds([65536, 65536, 131072]);
        eprintln!("ob1 thresholds (eager, rndv eager, max send): {limits:?}");
        limits.iter().map(u64::to_string).collect()
    })
}

/// A Python that has mpi4py built against this Open MPI (Debian's
/// `python3-mpi4py` is for `/usr/bin/python3`, which may not be the first
/// `python3` on the PATH), or why there is none: the one udbtl-prereq's
/// `Prereq::Mpi4py` found.
pub fn python_with_mpi4py() -> Result<&'static str, String> {
    static FOUND: OnceLock<Result<&'static str, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            udbtl_prereq::python_with_mpi4py()
                .ok_or_else(|| "no python3 with mpi4py (apt-get install python3-mpi4py)".into())
        })
        .clone()
}

/// A Python program of `tests/programs`.
pub fn python_program(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.py"))
}
