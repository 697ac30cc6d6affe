//! Running a job as the user `nobody`, so that tests, which run as root,
//! see what users see. The caller checks for root and `runuser`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::Run;

/// Runs the test program `program` with `args` under `run`, as `nobody`,
/// from copies of the program and the component in a fresh folder open to
/// every user (a checkout under /root is out of nobody's reach). The copy
/// of the program gets `mode`: 0o755, or 0o711 for a program nobody may
/// run but not read, whose processes the kernel then makes non-dumpable.
///
/// # Errors
/// Why nobody cannot run the copies here (the caller skips).
pub fn output(program: &str, run: &Run, args: &[&str], mode: u32) -> Result<Output, String> {
    let dir =
        std::env::temp_dir().join(format!("udbtl-as-nobody-{}-{program}", std::process::id()));
    let copies = Copies::make(&dir, &super::program(program), mode)?;
    let mut inner = run.command(&copies.exe, args);
    inner.env(
        "OMPI_MCA_mca_base_component_path",
        format!(
            "{}:{}",
            copies.component.display(),
            super::default_component_dir()
        ),
    );
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "nobody", "--", "env", "HOME=/tmp"]);
    // mpirun needs a working folder it can enter, which the test's may not be.
    cmd.current_dir(&dir);
    for (key, value) in inner.get_envs() {
        if let Some(value) = value {
            cmd.arg(format!(
                "{}={}",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
    }
    // As nobody: no --allow-run-as-root needed, but harmless.
    cmd.arg(inner.get_program()).args(inner.get_args());
    let out = cmd.output().map_err(|e| format!("runuser: {e}"));
    // Best effort: a leftover copy in the temporary folder harms nothing.
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// The copies of a program and the component that nobody runs.
struct Copies {
    exe: PathBuf,
    component: PathBuf,
}

impl Copies {
    fn make(dir: &Path, exe: &Path, mode: u32) -> Result<Self, String> {
        let component = dir.join("component");
        std::fs::create_dir_all(&component).map_err(|e| format!("{}: {e}", component.display()))?;
        for folder in [dir, &component] {
            set_mode(folder, 0o755)?;
        }
        let copy = |from: &Path, to: PathBuf, mode: u32| -> Result<PathBuf, String> {
            std::fs::copy(from, &to).map_err(|e| format!("copy {}: {e}", from.display()))?;
            set_mode(&to, mode)?;
            Ok(to)
        };
        let name = exe.file_name().ok_or("a program without a name")?;
        let exe = copy(exe, dir.join(name), mode)?;
        let library = "mca_btl_udbtl.so";
        copy(
            &super::component_dir().join(library),
            component.join(library),
            0o755,
        )?;
        let probe = Command::new("runuser")
            .args(["-u", "nobody", "--", "test", "-x"])
            .arg(&exe)
            .status()
            .map_err(|e| format!("runuser: {e}"))?;
        if !probe.success() {
            return Err(format!("nobody cannot run {}", exe.display()));
        }
        Ok(Self { exe, component })
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}
