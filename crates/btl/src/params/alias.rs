//! Parameters that were renamed: their old environment variables are still
//! read, as the new ones, with a warning, so that job scripts keep working.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{ParamError, env_var};

/// An old environment variable and the parameter it now sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renamed {
    /// The old variable, e.g. `UDBTL_UDP_IF`.
    pub old: &'static str,
    /// The parameter it sets now, e.g. `if_include`.
    pub now: &'static str,
}

/// Every renamed variable.
pub const RENAMED: &[Renamed] = &[Renamed {
    old: "UDBTL_UDP_IF",
    now: "if_include",
}];

/// `env` with each old variable read as the new one it stands for.
///
/// # Errors
/// [`ParamError::Renamed`] when both an old variable and its new one are
/// set: which one is meant cannot be told.
pub(super) fn follow(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<impl Fn(&str) -> Option<String> + '_, ParamError> {
    for renamed in RENAMED {
        if env(renamed.old).is_some() && env(&env_var(renamed.now)).is_some() {
            return Err(ParamError::Renamed {
                old: renamed.old,
                now: renamed.now,
            });
        }
        if env(renamed.old).is_some() {
            warn_once(renamed);
        }
    }
    Ok(move |name: &str| {
        env(name).or_else(|| {
            RENAMED
                .iter()
                .find(|renamed| env_var(renamed.now) == name)
                .and_then(|renamed| env(renamed.old))
        })
    })
}

/// The variable that set parameter `name` in this process's environment:
/// its own, or the old one it was renamed from.
pub(crate) fn spelled(name: &str) -> String {
    let own = env_var(name);
    if std::env::var_os(&own).is_some() {
        return own;
    }
    RENAMED
        .iter()
        .find(|renamed| renamed.now == name && std::env::var_os(renamed.old).is_some())
        .map_or(own, |renamed| renamed.old.to_owned())
}

fn warn_once(renamed: &Renamed) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{} is read as {} (its new name; the old one will go)",
            renamed.old,
            env_var(renamed.now)
        );
    }
}
