//! The command line, and how a bad one is reported (one line, exit 2).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Parser, ValueEnum};

use crate::hosts::HostSpec;

/// Starts N ranks of a program, serves them PMI-1, forwards their output
/// and ends the job when one fails.
#[derive(Debug, Parser)]
#[command(
    name = "udrun",
    version,
    after_help = "Each rank gets PMI_FD, PMI_RANK and PMI_SIZE (PMI_PORT and PMI_ID on a \
                  remote host), UDBTL_JOB_KEY and UDRUN_JOB_KEY (the job's random key), \
                  UDRUN_LOCAL_RANK and UDRUN_LOCAL_SIZE. When a rank exits non-zero, dies \
                  of a signal or calls PMI abort, the other ranks are killed at once and \
                  udrun exits with that rank's code (128+N for signal N).\n\n\
                  Remote ranks connect back to udrun's PMI port and must prove they hold \
                  the job's random secret (UDBTL_PMI_SECRET), which udrun writes, with \
                  the job key, into the launcher's standard input: neither is on any \
                  command line. Other connections are refused and counted."
)]
pub(crate) struct Cli {
    /// Number of ranks ("-np N" works too).
    #[arg(short = 'n', value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) ranks: u32,

    /// Hosts to run on, filled in order (HOST has one slot, HOST:SLOTS that
    /// many). localhost, 127.0.0.1 and this machine's name run here; other
    /// hosts are reached with ssh.
    #[arg(
        short = 'H',
        long,
        value_name = "HOST[:SLOTS],...",
        value_delimiter = ',',
        value_parser = HostSpec::parse,
        conflicts_with = "hostfile"
    )]
    pub(crate) host: Vec<HostSpec>,

    /// Read the hosts from FILE: one per line, "HOST [slots=N]", # comments.
    #[arg(long, value_name = "FILE")]
    pub(crate) hostfile: Option<PathBuf>,

    /// Pin local rank i to the i-th CPU udrun may use (modulo their count).
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = BindTo::None)]
    pub(crate) bind_to: BindTo,

    /// Export VAR (its value here) or set VAR=VALUE in every rank. Local
    /// ranks inherit udrun's environment anyway. May be repeated.
    #[arg(short = 'x', value_name = "VAR[=VALUE]", value_parser = Export::parse)]
    pub(crate) export: Vec<Export>,

    /// Allow more ranks than slots (or, with no host list, than the CPUs
    /// udrun may use): they wrap around the hosts. Also set by
    /// UDRUN_OVERSUBSCRIBE=1.
    #[arg(long)]
    pub(crate) oversubscribe: bool,

    /// Kill the job after SECONDS (exit status 124, as timeout(1)).
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    pub(crate) timeout: Option<Duration>,

    /// Prefix every output line with its rank in brackets.
    #[arg(long, help = "Prefix every output line with \"[RANK] \"")]
    pub(crate) tag_output: bool,

    /// Print the time from the first spawn to the first barrier's release.
    #[arg(long)]
    pub(crate) report_startup: bool,

    /// End the job when a rank has not connected to PMI SECONDS after the
    /// launch (checked once some rank of the job uses PMI: a job that never
    /// does is left alone).
    #[arg(
        long,
        value_name = "SECONDS",
        value_parser = parse_timeout,
        default_value = "60"
    )]
    pub(crate) startup_timeout: Duration,

    /// Serve remote ranks' PMI on every address of this host (0.0.0.0), as
    /// before, instead of only on the address this host's name resolves
    /// to, which is what the ranks are told to connect to. For multi-homed
    /// hosts whose name resolves differently on the compute nodes.
    /// Connections still must prove they hold the job's secret.
    #[arg(long)]
    pub(crate) pmi_listen_any: bool,

    /// Program used to reach remote hosts, called as
    /// "PROG -o BatchMode=yes -o ConnectTimeout=5 HOST COMMAND".
    #[arg(long, value_name = "PROG", default_value = "ssh")]
    pub(crate) launcher_exec: OsString,

    /// The program to run, and its arguments (after "--" when they could be
    /// taken for udrun's options).
    #[arg(value_name = "PROGRAM", required = true, trailing_var_arg = true)]
    pub(crate) command: Vec<OsString>,
}

/// `--bind-to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BindTo {
    /// One CPU per local rank.
    Core,
    /// No pinning.
    None,
}

/// One `-x`: a variable to pass on, with its value when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Export {
    pub(crate) name: String,
    pub(crate) value: Option<String>,
}

impl Export {
    fn parse(text: &str) -> Result<Self, String> {
        let (name, value) = match text.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (text, None),
        };
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("{name:?} is not a variable name"));
        }
        Ok(Self {
            name: name.to_owned(),
            value,
        })
    }
}

/// `--timeout`: whole or fractional seconds, more than 0.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(secs) if secs > 0.0 && secs.is_finite() && secs < 1e9 => {
            Ok(Duration::from_secs_f64(secs))
        }
        _ => Err(format!("{text:?} is not a number of seconds above 0")),
    }
}

/// Reports a command-line error on one line and returns exit status 2;
/// `--help` and `--version` print as usual and return 0.
pub(crate) fn usage(err: &clap::Error) -> ExitCode {
    if !err.use_stderr() {
        return match err.print() {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(1),
        };
    }
    // clap's message without its usage block: the first paragraph, its
    // lines (a list of missing arguments, say) joined into one.
    let text = err.render().to_string();
    let message: Vec<&str> = text
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    // clap's tips ("a similar argument exists: '--tag-output'"), which
    // follow in paragraphs of their own, before the usage.
    let tips: Vec<&str> = text
        .lines()
        .take_while(|line| !line.starts_with("Usage:"))
        .filter_map(|line| line.trim().strip_prefix("tip: "))
        .collect();
    let help = match (err.kind(), tips.is_empty()) {
        (ErrorKind::ValueValidation, true) => String::new(),
        (ErrorKind::ValueValidation, false) => format!(" (tip: {})", tips.join("; ")),
        (_, true) => " (see udrun --help)".to_owned(),
        (_, false) => format!(" (tip: {}; see udrun --help)", tips.join("; ")),
    };
    crate::say(format_args!("{message}{help}"));
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports() {
        assert_eq!(
            Export::parse("A_1=x=y").unwrap(),
            Export {
                name: "A_1".into(),
                value: Some("x=y".into())
            }
        );
        assert_eq!(Export::parse("HOME").unwrap().value, None);
        assert!(Export::parse("1A").is_err());
        assert!(Export::parse("=x").is_err());
        assert!(Export::parse("A-B").is_err());
    }

    #[test]
    fn program_arguments_need_no_separator() {
        let cli = Cli::try_parse_from(["udrun", "-n", "2", "echo", "-n", "--tag-output"]).unwrap();
        assert_eq!(cli.command, ["echo", "-n", "--tag-output"]);
        assert!(!cli.tag_output);
        let cli = Cli::try_parse_from(["udrun", "-n2", "--", "-weird", "x"]).unwrap();
        assert_eq!(cli.command, ["-weird", "x"]);
        assert!(Cli::try_parse_from(["udrun", "-n", "2", "--tag-outptu", "echo"]).is_err());
        let cli =
            Cli::try_parse_from(["udrun", "-n", "3", "--host", "a:2,b", "-x", "V=1", "p"]).unwrap();
        assert_eq!(cli.host.len(), 2);
        assert_eq!(cli.export.len(), 1);
    }
}
