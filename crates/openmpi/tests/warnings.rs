//! udbtl's warnings reach the user under Open MPI, once per node: a
//! misspelled `UDBTL_*` variable, and, for a user without CAP_NET_ADMIN, a
//! socket buffer the kernel capped below what udbtl asked for (run as
//! `nobody`, so the tests, which run as root, see what users see; ignored,
//! `SKIPPED: ...`, without root or `runuser`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Run;

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn a_misspelled_variable_is_named_once_per_node() {
    require_openmpi!();
    let exe = common::program("hello");
    let _turn = common::serial();
    let out = Run::udbtl(3)
        .env("UDBTL_PEER_TIMOUT", "5000")
        .success(&exe, &[]);
    let all = text(&out);
    let warning = "UDBTL_PEER_TIMOUT is not a udbtl variable and is ignored; did you mean \
                   UDBTL_PEER_TIMEOUT?";
    assert_eq!(all.matches(warning).count(), 1, "{all}");
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "runuser"
    ),
    ignore = "SKIPPED: needs Open MPI, root and runuser (util-linux)"
)]
fn a_capped_socket_buffer_is_told_to_a_user_without_privileges() {
    require_openmpi!();
    udbtl_prereq::require!(
        udbtl_prereq::Prereq::Root,
        udbtl_prereq::Prereq::Program("runuser")
    );
    let _turn = common::serial();
    // The program and the component, where nobody can read them: a target
    // folder under a private one (a checkout in /root, a mktemp folder) is
    // out of its reach.
    let (exe, component) = match readable_by_nobody(&common::program("hello")) {
        Ok(copies) => copies,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return;
        }
    };
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(212_992);
    // More than the kernel lets an unprivileged process have (at most the
    // parameter's bound, 1 GiB).
    let asked = (rmem_max * 4).clamp(4 << 20, 1 << 30);
    let run = Run::udbtl(2).mca("btl_udbtl_udp_sockbuf", &asked.to_string());
    let mut inner = run.command(&exe, &[]);
    inner.env(
        "OMPI_MCA_mca_base_component_path",
        format!(
            "{}:{}",
            component.display(),
            common::default_component_dir()
        ),
    );
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "nobody", "--", "env", "HOME=/tmp"]);
    // mpirun needs a working folder it can enter, which the test's may not be.
    if let Some(copies) = exe.parent() {
        cmd.current_dir(copies);
    }
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
    let out = cmd.output().expect("run mpirun as nobody");
    if let Some(copies) = exe.parent() {
        // Best effort: a leftover copy in the temporary folder harms nothing.
        let _ = std::fs::remove_dir_all(copies);
    }
    let all = text(&out);
    assert!(out.status.success(), "the job must run as nobody:\n{all}");
    let capped = all.matches("warning: the kernel capped SO_RCVBUF").count();
    assert_eq!(capped, 1, "one warning for the node:\n{all}");
    assert!(
        all.contains(&format!("below the {asked} asked for")),
        "{all}"
    );
}

/// Copies `exe` and the component into a fresh folder of this process
/// under the system's temporary folder, open to every user; returns the
/// copy of `exe` and the component's folder, or why nobody cannot run them
/// even there. The caller checked for root.
fn readable_by_nobody(exe: &Path) -> Result<(PathBuf, PathBuf), String> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("udbtl-as-nobody-{}", std::process::id()));
    let component = dir.join("component");
    std::fs::create_dir_all(&component).map_err(|e| format!("{}: {e}", component.display()))?;
    for folder in [&dir, &component] {
        std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", folder.display()))?;
    }
    let copy = |from: &Path, to: PathBuf| -> Result<PathBuf, String> {
        std::fs::copy(from, &to).map_err(|e| format!("copy {}: {e}", from.display()))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", to.display()))?;
        Ok(to)
    };
    let exe = copy(exe, dir.join("hello"))?;
    let library = "mca_btl_udbtl.so";
    copy(
        &common::component_dir().join(library),
        component.join(library),
    )?;
    let probe = Command::new("runuser")
        .args(["-u", "nobody", "--", "test", "-x"])
        .arg(&exe)
        .status()
        .map_err(|e| format!("runuser: {e}"))?;
    if !probe.success() {
        return Err(format!("nobody cannot run {}", exe.display()));
    }
    Ok((exe, component))
}
