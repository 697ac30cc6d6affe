//! The probes: whether each [`Prereq`] is present, and what a build script
//! must watch so that it probes again once that may have changed.

use std::env;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::Prereq;

/// What one probe found.
#[derive(Debug, Default)]
pub(crate) struct Finding {
    /// Why the prerequisite is missing, or `None` when it is present.
    pub(crate) missing: Option<String>,
    /// Files and folders whose change may change the answer. Each exists
    /// (cargo reruns a build script at every build while a path it watches
    /// is missing, and rebuilds the crate, and everything above it, each
    /// time). A folder counts as changed when anything in it, or the
    /// folder itself, is newer than the last run, so a file installed with
    /// an old time still changes the folder it lands in.
    pub(crate) watch: Vec<PathBuf>,
    /// Environment variables the answer depends on.
    pub(crate) env: Vec<&'static str>,
}

/// Probes `need` on this machine, now.
pub(crate) fn probe(need: Prereq) -> Finding {
    match need {
        Prereq::Root => root(),
        Prereq::Program(name) => programs(&[name], "put it on the PATH"),
        Prereq::OpenMpi => programs(
            &["mpirun.openmpi", "mpicc.openmpi"],
            "apt-get install openmpi-bin libopenmpi-dev",
        ),
        Prereq::SharedTools => shared_tools(),
        Prereq::Mpi4py => mpi4py(),
        Prereq::Libclang => libclang(),
        Prereq::Slurm => slurm(),
        Prereq::VerbsDevice => verbs_device(),
    }
}

/// The effective user id is 0. A process's user is fixed for its life, and
/// nothing on disk tells that the next build runs as someone else: the
/// test's own check at run time covers a build made as another user.
fn root() -> Finding {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    // "Uid:\t<real>\t<effective>\t<saved>\t<filesystem>"
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1));
    Finding {
        missing: (effective != Some("0")).then(|| "needs root".to_owned()),
        ..Finding::default()
    }
}

/// The absolute folders of the `PATH`, in order.
fn path_dirs() -> Vec<PathBuf> {
    env::var_os("PATH")
        .map(|path| {
            env::split_paths(&path)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default()
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where `program` would run from: itself if it holds a `/`, else the
/// first executable of that name in a folder of the `PATH`.
fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return is_executable(&path).then_some(path);
    }
    path_dirs()
        .into_iter()
        .map(|dir| dir.join(program))
        .find(|path| is_executable(path))
}

/// Every program of `names` on the `PATH`. Watches each one found (its
/// removal or replacement) and, when one is missing, every folder of the
/// `PATH` (its arrival).
fn programs(names: &[&str], how: &str) -> Finding {
    let mut finding = Finding {
        env: vec!["PATH"],
        ..Finding::default()
    };
    let mut absent = Vec::new();
    for name in names {
        match find_program(name) {
            Some(path) => finding.watch.push(path),
            None => absent.push(*name),
        }
    }
    if !absent.is_empty() {
        finding.missing = Some(format!("{} not on the PATH ({how})", absent.join(" and ")));
        finding
            .watch
            .extend(path_dirs().into_iter().filter(|d| d.is_dir()));
    }
    finding
}

/// The files of the system's package database that every install or
/// removal rewrites: the trigger for what packages put outside the `PATH`
/// (a Python module, a library).
fn package_databases() -> Vec<PathBuf> {
    [
        "/var/lib/dpkg/status",
        "/var/lib/rpm/rpmdb.sqlite",
        "/var/lib/rpm/Packages",
        "/lib/apk/db/installed",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.is_file())
    .collect()
}

/// The folder of the stand-in host tools (`twohosts`, `nsssh`):
/// `UDBTL_SHARED_TOOLS`, else the workspace's own `scripts/standin`.
pub fn shared_tools_dir() -> PathBuf {
    env::var_os("UDBTL_SHARED_TOOLS").map_or_else(
        // This crate is <workspace>/crates/prereq.
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/standin"),
        PathBuf::from,
    )
}

fn shared_tools() -> Finding {
    let dir = shared_tools_dir();
    let mut finding = programs(&["ip", "flock"], "apt-get install iproute2 util-linux");
    finding.env.push("UDBTL_SHARED_TOOLS");
    let tools: Vec<PathBuf> = ["twohosts", "nsssh"].iter().map(|t| dir.join(t)).collect();
    if tools.iter().all(|t| t.is_file()) {
        finding.watch.extend(tools);
        return finding;
    }
    // Watch the folder, or the one holding it, but nothing further up:
    // that is the folder of every checkout, whose builds change it all the
    // time. A build made before both existed needs UDBTL_SHARED_TOOLS set,
    // or `cargo clean -p <crate>`, to see them.
    if let Some(existing) = [Some(dir.as_path()), dir.parent()]
        .into_iter()
        .flatten()
        .find(|d| d.is_dir())
    {
        finding.watch.push(existing.to_path_buf());
    }
    let reason = format!(
        "the stand-in host tools are not in {} (twohosts and nsssh; UDBTL_SHARED_TOOLS \
         names another folder)",
        dir.display()
    );
    finding.missing = Some(match finding.missing {
        Some(programs) => format!("{reason}; {programs}"),
        None => reason,
    });
    finding
}

/// Runs `program args`, stdin and stderr closed, for at most `limit`;
/// its stdout if it exited with success in time.
fn output_within(program: &str, args: &[&str], limit: Duration) -> Option<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let started = Instant::now();
    // The probes print a line at most: it fits the pipe, so waiting before
    // reading cannot block the child.
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let mut stdout = String::new();
    child.stdout.take()?.read_to_string(&mut stdout).ok()?;
    status.success().then_some(stdout)
}

/// The Pythons tried for mpi4py, in order: Debian's `python3-mpi4py` is
/// for `/usr/bin/python3`, which may not be the first `python3` on the
/// `PATH`.
const PYTHONS: [&str; 2] = ["/usr/bin/python3", "python3"];

/// A Python 3 that imports mpi4py, and the module's `__init__.py`.
fn find_mpi4py() -> Option<(&'static str, PathBuf)> {
    let script = "import mpi4py, sys; sys.stdout.write(mpi4py.__file__)";
    PYTHONS.into_iter().find_map(|python| {
        let file = output_within(python, &["-c", script], Duration::from_secs(20))?;
        Some((python, PathBuf::from(file.trim())))
    })
}

/// The first Python 3 that imports mpi4py, or `None`.
pub fn python_with_mpi4py() -> Option<&'static str> {
    find_mpi4py().map(|(python, _)| python)
}

fn mpi4py() -> Finding {
    match find_mpi4py() {
        Some((_, module)) => Finding {
            watch: vec![module].into_iter().filter(|m| m.exists()).collect(),
            ..Finding::default()
        },
        None => Finding {
            missing: Some("no python3 with mpi4py (apt-get install python3-mpi4py)".into()),
            watch: package_databases()
                .into_iter()
                .chain(path_dirs().into_iter().filter(|d| d.is_dir()))
                .collect(),
            env: vec!["PATH"],
        },
    }
}

/// Whether `name` is a libclang bindgen can load: `libclang.so`,
/// `libclang.so.N`, `libclang-N.so`, `libclang-N.so.M` (not libclang-cpp).
fn is_libclang(name: &str) -> bool {
    let shared = name.ends_with(".so") || name.contains(".so.");
    name == "libclang.so"
        || name.starts_with("libclang.so.")
        || (name.starts_with("libclang-") && !name.starts_with("libclang-cpp") && shared)
}

/// The folders clang-sys looks in (besides asking llvm-config).
fn libclang_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("LIBCLANG_PATH")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    for parent in ["/usr/lib", "/usr/lib64", "/usr/local/lib"] {
        dirs.push(parent.into());
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // /usr/lib/llvm-14/lib, /usr/lib/x86_64-linux-gnu
            if name.starts_with("llvm") {
                dirs.push(entry.path().join("lib"));
            } else if name.ends_with("-linux-gnu") {
                dirs.push(entry.path());
            }
        }
    }
    dirs
}

fn libclang() -> Finding {
    let found = libclang_dirs().into_iter().find_map(|dir| {
        fs::read_dir(dir)
            .ok()?
            .flatten()
            .find(|e| is_libclang(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
    });
    match found {
        Some(library) => Finding {
            watch: vec![library],
            env: vec!["LIBCLANG_PATH"],
            ..Finding::default()
        },
        None => Finding {
            missing: Some(
                "no libclang (bindgen needs it for the rsmpi program: apt-get install \
                 libclang-dev, or set LIBCLANG_PATH)"
                    .into(),
            ),
            watch: package_databases(),
            env: vec!["LIBCLANG_PATH"],
        },
    }
}

fn slurm() -> Finding {
    let mut finding = programs(&["sinfo", "srun"], "apt-get install slurm-wlm");
    finding.env.push("SLURM_CONF");
    // Whether it answers is a state, not a file: watch the configuration,
    // which scripts/slurm-local.sh writes at every start, so that starting
    // Slurm that way reruns the probe. The test checks again when it runs.
    let conf = env::var_os("SLURM_CONF").map_or_else(
        || {
            ["/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"]
                .iter()
                .map(PathBuf::from)
                .find(|c| c.is_file())
        },
        |c| Some(PathBuf::from(c)),
    );
    finding.watch.extend(conf.filter(|c| c.is_file()));
    if finding.missing.is_none()
        && output_within("sinfo", &["-h"], Duration::from_secs(3)).is_none()
    {
        finding.missing =
            Some("no Slurm cluster answers `sinfo` (scripts/slurm-local.sh starts one)".into());
    }
    finding
}

fn verbs_device() -> Finding {
    const VAR: &str = "UDBTL_TEST_VERBS_DEVICE";
    let named = env::var(VAR).is_ok_and(|name| !name.trim().is_empty());
    Finding {
        missing: (!named).then(|| {
            format!(
                "needs an RDMA device: {VAR} is not set (set it to a device of \
                 /sys/class/infiniband, e.g. mlx5_0 or rxe0, and build with --features verbs)"
            )
        }),
        env: vec![VAR],
        ..Finding::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libclang_names() {
        for yes in [
            "libclang.so",
            "libclang.so.1",
            "libclang-14.so",
            "libclang-14.so.1",
        ] {
            assert!(is_libclang(yes), "{yes}");
        }
        for no in [
            "libclang-cpp.so.14",
            "libclangAST.a",
            "libclang.a",
            "libclang-14.a",
        ] {
            assert!(!is_libclang(no), "{no}");
        }
    }

    #[test]
    fn a_slow_program_is_given_up_on() {
        let started = Instant::now();
        assert_eq!(
            output_within("sleep", &["10"], Duration::from_millis(200)),
            None
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            output_within("sh", &["-c", "echo hi"], Duration::from_secs(10)).as_deref(),
            Some("hi\n")
        );
    }

    #[test]
    fn every_watched_path_exists() {
        for need in [
            Prereq::Root,
            Prereq::Program("udbtl-no-such-tool"),
            Prereq::SharedTools,
            Prereq::Libclang,
        ] {
            for path in probe(need).watch {
                assert!(path.exists(), "{need:?} watches {}", path.display());
            }
        }
    }
}
