//! mpirun's spellings on udrun's command line: its names for udrun's
//! options are rewritten to udrun's, and its options udrun does not have
//! are refused with what to do instead, before clap parses anything.
//!
//! Only udrun's own options are looked at, those before PROGRAM: what
//! follows is the rank's command line, whatever it looks like. Without this,
//! mpirun's single-dash long options would be read as clusters of short
//! ones (`-host` as `-h`, which prints the help and succeeds), and its
//! other options would get clap's advice to pass them to PROGRAM after
//! `--`, which is not what anyone typing `--map-by` wants.

use std::ffi::OsString;

use udbtl_btl::params::env::param_named;

/// udrun's options that take a value, to tell where PROGRAM starts.
const VALUE_OPTIONS: [&str; 9] = [
    "-n",
    "-H",
    "--host",
    "--hostfile",
    "--bind-to",
    "-x",
    "--launcher-exec",
    "--timeout",
    "--startup-timeout",
];

/// mpirun's names (Open MPI's and MPICH's hydra's) for udrun's options,
/// with udrun's.
const SPELLINGS: [(&str, &str); 11] = [
    ("-np", "-n"),
    ("--np", "-n"),
    ("--n", "-n"),
    ("-host", "--host"),
    ("-hostfile", "--hostfile"),
    ("-machinefile", "--hostfile"),
    ("--machinefile", "--hostfile"),
    ("-bind-to", "--bind-to"),
    ("-oversubscribe", "--oversubscribe"),
    ("-tag-output", "--tag-output"),
    ("-timeout", "--timeout"),
];

/// mpirun's options that udrun does not have: their names, how many values
/// follow them, and the closest thing udrun does.
const UNSUPPORTED: [(&[&str], usize, &str); 7] = [
    (
        &["--map-by", "-map-by"],
        1,
        "ranks fill the hosts in order, SLOTS consecutive ranks on each \
         (--host a:2,b:2, or slots=N in a --hostfile)",
    ),
    (
        &["--rank-by", "-rank-by"],
        1,
        "ranks are numbered in the order they fill the hosts \
         (--host a:2,b:2, or slots=N in a --hostfile)",
    ),
    (
        &["-N", "--npernode", "-npernode", "-ppn"],
        1,
        "give each host its slots (--host a:4,b:4) and -n the total",
    ),
    (
        &["--pernode", "-pernode"],
        0,
        "give each host one slot (--host a,b, the default) and -n the number of hosts",
    ),
    (
        &[
            "--report-bindings",
            "-report-bindings",
            "--display-map",
            "-display-map",
        ],
        0,
        "ranks fill the hosts in order, SLOTS consecutive ranks on each, and \
         --bind-to core pins local rank i to the i-th CPU udrun may use",
    ),
    (
        &["--allow-run-as-root", "-allow-run-as-root"],
        0,
        "udrun needs no permission to run as root: drop the option",
    ),
    (
        &["--mca", "-mca", "--gmca", "-gmca"],
        2,
        "udbtl's parameters are environment variables, set in every rank with \
         -x UDBTL_<NAME>=VALUE (udinfo lists them)",
    ),
];

/// What `--bind-to` takes.
const BIND_TO: [&str; 2] = ["core", "none"];

/// Rewrites mpirun's spellings among udrun's own options (before PROGRAM)
/// to udrun's: `-np N`, `-npN`, `-np=N` and `--np N` to `-n`, `-host` to
/// `--host` and so on (see [`SPELLINGS`]).
///
/// # Errors
/// An option of mpirun's that udrun does not have (`--map-by`, `--mca`,
/// ...), or a `--bind-to` other than `core` or `none`: the message says so
/// and what udrun offers instead, for a usage error (exit 2).
pub(crate) fn args(args: impl IntoIterator<Item = OsString>) -> Result<Vec<OsString>, String> {
    let mut out = Vec::new();
    let mut args = args.into_iter().peekable();
    // The program name.
    out.extend(args.next());
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        if text == "--" || !text.starts_with('-') || text == "-" {
            out.push(arg);
            out.extend(args);
            break;
        }
        let (name, attached) = match text.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (text.as_str(), None),
        };
        if let Some((_, values, instead)) = UNSUPPORTED.iter().find(|u| u.0.contains(&name)) {
            let mut given: Vec<String> = attached.map(str::to_owned).into_iter().collect();
            while given.len() < *values {
                match args.next() {
                    Some(value) => given.push(value.to_string_lossy().into_owned()),
                    None => break,
                }
            }
            return Err(unsupported(name, &given, instead));
        }
        if let Some(count) = np_count(&text) {
            out.push(format!("-n{count}").into());
            continue;
        }
        let name = SPELLINGS
            .iter()
            .find(|(theirs, _)| *theirs == name)
            .map_or(name, |(_, ours)| ours);
        let value = match attached {
            Some(value) => Some(OsString::from(value)),
            None if VALUE_OPTIONS.contains(&name) => args.next(),
            None => None,
        };
        if name == "--bind-to" {
            if let Some(what) = value.as_ref().map(|v| v.to_string_lossy()) {
                if !BIND_TO.contains(&what.as_ref()) {
                    return Err(format!(
                        "--bind-to {what} is not supported: udrun binds to cores only, \
                         --bind-to core (one CPU per local rank) or --bind-to none"
                    ));
                }
            }
        }
        match (attached, value) {
            // Passed on as given, with udrun's name.
            (Some(_), Some(value)) => {
                let mut joined = OsString::from(format!("{name}="));
                joined.push(value);
                out.push(joined);
            }
            (None, value) => {
                out.push(if name == text { arg } else { name.into() });
                out.extend(value);
            }
            (Some(_), None) => out.push(arg),
        }
    }
    Ok(out)
}

/// N of `-npN` or `-np=N` (clap's short options are one letter).
fn np_count(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("-np")?;
    if rest.is_empty() {
        return None;
    }
    let count = rest.strip_prefix('=').unwrap_or(rest);
    (!count.is_empty() && count.bytes().all(|b| b.is_ascii_digit())).then_some(count)
}

/// The message for an option of mpirun's that udrun does not have:
/// `--mca btl_udbtl_NAME VALUE` gets the `-x` that does it.
fn unsupported(name: &str, values: &[String], instead: &str) -> String {
    let specific = match values {
        [key, value] if name.ends_with("mca") => param_named(key).ok().map(|param| {
            format!(
                "udbtl's parameters are environment variables: -x UDBTL_{}={value} \
                 sets {key} in every rank (udinfo lists them)",
                param.to_ascii_uppercase()
            )
        }),
        _ => None,
    };
    format!(
        "{name} is not supported: {}",
        specific.as_deref().unwrap_or(instead)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn os(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn np_becomes_n_before_the_program_only() {
        let rewritten = args(os(&["udrun", "-np", "4", "-x", "-np", "prog", "-np", "3"]));
        assert_eq!(
            rewritten.unwrap(),
            os(&["udrun", "-n", "4", "-x", "-np", "prog", "-np", "3"])
        );
        let rewritten = args(os(&["udrun", "-np4", "--", "-np", "2"]));
        assert_eq!(rewritten.unwrap(), os(&["udrun", "-n4", "--", "-np", "2"]));
        let rewritten = args(os(&["udrun", "--tag-output", "-np=2", "-H", "a", "p"]));
        assert_eq!(
            rewritten.unwrap(),
            os(&["udrun", "--tag-output", "-n2", "-H", "a", "p"])
        );
        let rewritten = args(os(&["udrun", "-np", "3", "-H", "a,b", "p"])).unwrap();
        let cli = Cli::try_parse_from(rewritten).unwrap();
        assert_eq!((cli.ranks, cli.host.len()), (3, 2));
    }

    #[test]
    fn mpirun_names_become_udruns() {
        let rewritten = args(os(&[
            "udrun",
            "--np",
            "2",
            "-host",
            "a,b",
            "-bind-to=core",
            "-oversubscribe",
            "p",
            "-host",
        ]));
        assert_eq!(
            rewritten.unwrap(),
            os(&[
                "udrun",
                "-n",
                "2",
                "--host",
                "a,b",
                "--bind-to=core",
                "--oversubscribe",
                "p",
                "-host"
            ])
        );
        let rewritten = args(os(&["udrun", "-n", "2", "-machinefile", "f", "p"]));
        assert_eq!(
            rewritten.unwrap(),
            os(&["udrun", "-n", "2", "--hostfile", "f", "p"])
        );
    }

    #[test]
    fn options_udrun_lacks_are_refused_with_what_to_do() {
        let refused = |words: &[&str]| args(os(words)).unwrap_err();
        let err = refused(&["udrun", "--map-by", "core", "-n", "2", "p"]);
        assert!(err.starts_with("--map-by is not supported: "), "{err}");
        assert!(err.contains("--host a:2,b:2"), "{err}");
        let err = refused(&["udrun", "-n", "2", "--mca", "btl_udbtl_sd_num", "256", "p"]);
        assert!(err.contains("-x UDBTL_SD_NUM=256"), "{err}");
        let err = refused(&["udrun", "-mca", "btl", "self,udbtl", "-n", "2", "p"]);
        assert!(err.contains("-x UDBTL_<NAME>=VALUE"), "{err}");
        let err = refused(&["udrun", "--bind-to", "socket", "-n", "2", "p"]);
        assert!(err.contains("--bind-to socket is not supported"), "{err}");
        let err = refused(&["udrun", "--mca"]);
        assert!(err.starts_with("--mca is not supported"), "{err}");
        // The program's own options are its own.
        let kept = args(os(&["udrun", "-n", "2", "p", "--map-by", "x"])).unwrap();
        assert_eq!(kept, os(&["udrun", "-n", "2", "p", "--map-by", "x"]));
    }
}
