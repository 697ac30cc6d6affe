//! `udinfo`: what udbtl would use on this host, as
//! `ompi_info --param btl ofud --level 9` showed it for `btl_ofud`.
//!
//! It prints four sections:
//!
//! 1. **Providers**: `udp` (real) and `sim` (the in-process simulated fabric
//!    of the tests, which has no devices outside a test).
//! 2. **Devices**: the `udp` provider's devices and ports, configured as the
//!    parameters ask (`if_include`, `if_exclude`, `udp_ipv6`, `udp_mtu`), and
//!    whether a module may be built on each.
//! 3. **Parameters**: every parameter with its value, default, source, the
//!    environment variable that sets it and its help, marked as the seed's
//!    (`btl_ofud`) or a udbtl addition.
//!    Where a module uses another value than the one asked for (`rd_num`
//!    lowered to fit `rd_mem`, `send_frags_max` to fit `send_mem`, a
//!    `max_send_size` over the port's datagram), the value in force follows.
//! 4. **Other variables**: the `UDBTL_*` variables that are not parameters
//!    (`UDBTL_DUMP`, `UDBTL_MODEX`, `UDBTL_FAULT_*`), with their values.
//! 5. **Modules**: the sizes each module actually uses, read from a component
//!    built on the `udp` provider and finalized at once. If none can be
//!    built, the reason goes to stderr, the listing is still printed, and
//!    udinfo exits 1.
//!
//! `--param NAME` prints that parameter only, with its value in force (NAME
//! as `sd_num`, `UDBTL_SD_NUM`, Open MPI's `btl_udbtl_sd_num` or the seed's
//! `btl_ofud_sd_num`; a misspelt one gets the closest name);
//! `--dump` adds each module's state (`btl_dump`). A `UDBTL_*` variable udbtl
//! does not read is reported on stderr with the closest real name. Log
//! output (`RUST_LOG`, default `warn`) goes to stderr.
//!
//! # Parsable output
//!
//! `--parsable` prints one `section:key...:field:value` line per fact, as
//! `ompi_info --parsable` does. The value is everything after the field, and
//! may itself hold colons (a port list such as `mlx4_1:2`):
//!
//! ```text
//! provider:udp:kind:real
//! device:lo:1:max_msg_size:65491
//! param:sd_num:value:128
//! param:sd_num:source:default
//! param:rd_num:in_force:1024
//! env:UDBTL_DUMP:value:unset
//! module:lo:1:eager_limit:65451
//! ```
//!
//! # Exit status
//!
//! 0 when the listing was printed and a module could be built, 1 when no
//! module could be built (no usable port: the listing is still printed), for
//! an invalid parameter or an output error, 2 for a bad command line.

use std::error::Error;
use std::fmt::{self};
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

mod devices;
mod listing;
mod modules;
mod params;

use clap::Parser;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use udbtl_btl::params::env::{self};
use udbtl_btl::params::{ParamError, ParamInfo};
use udbtl_btl::{BtlConfig, Params, udp_config};
use udbtl_fabric::udp::UdpProvider;

use crate::devices::{devices, providers, rdma_devices};
use crate::listing::Listing;
use crate::modules::{build_modules, modules};
use crate::params::{in_force, other_variables, parameters};

/// Shows the providers, devices, parameters and module sizes udbtl would use
/// on this host, like ompi_info --param btl ofud --level 9.
#[derive(Debug, Parser)]
#[command(
    name = "udinfo",
    version,
    after_help = "Parameters are set with UDBTL_<NAME> environment variables, \
                  e.g. UDBTL_SD_NUM=256. RUST_LOG sets the log level (default warn)."
)]
struct Cli {
    /// Show only parameter NAME (sd_num, UDBTL_SD_NUM, Open MPI's
    /// btl_udbtl_sd_num or the seed's btl_ofud_sd_num). May be repeated.
    #[arg(long, value_name = "NAME")]
    param: Vec<String>,

    /// Print machine-readable section:key:field:value lines.
    #[arg(long)]
    parsable: bool,

    /// Also print each module's state, as btl_dump does.
    #[arg(long, conflicts_with = "param")]
    dump: bool,
}

/// Why `udinfo` failed.
#[derive(Debug)]
enum Failure {
    /// A parameter's value is invalid: exit 1.
    Param(ParamError),
    /// The listing could not be written: exit 1, or 0 for a closed pipe.
    Output(io::Error),
    /// No module could be built (the reason is already on stderr): exit 1.
    NoModule,
}

impl From<ParamError> for Failure {
    fn from(err: ParamError) -> Self {
        Self::Param(err)
    }
}

impl From<io::Error> for Failure {
    fn from(err: io::Error) -> Self {
        Self::Output(err)
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage(&err),
    };
    // Looked up here rather than by clap, whose message would bury the
    // suggestion behind "invalid value ... for '--param <NAME>'".
    let selected = match cli
        .param
        .iter()
        .map(|name| env::param_named(name))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(selected) => selected,
        Err(err) => {
            complain(format_args!("--param: {err}"));
            return ExitCode::from(2);
        }
    };
    // Warnings at least (a port skipped while building modules), or what
    // RUST_LOG asks for.
    udbtl::log_to_stderr();
    match run(&cli, &selected) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Param(err)) => {
            complain(format_args!("{err}"));
            ExitCode::from(1)
        }
        // `udinfo | head`: the reader has seen what it wanted.
        Err(Failure::Output(err)) if err.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(Failure::Output(err)) => {
            complain(format_args!("cannot write the listing: {err}"));
            ExitCode::from(1)
        }
        Err(Failure::NoModule) => ExitCode::from(1),
    }
}

/// Prints the listing, or only the parameters `selected` when there are
/// any.
fn run(cli: &Cli, selected: &[&str]) -> Result<(), Failure> {
    let params = Params::load(&BtlConfig::default())?;
    for unknown in env::unknown_env_vars() {
        complain(format_args!("warning: {unknown}"));
    }
    let mut out = Listing {
        out: BufWriter::new(io::stdout().lock()),
        parsable: cli.parsable,
        sections: 0,
    };
    let udp = UdpProvider::new(udp_config(&params));
    // Built first, so that the parameters can show the values in force;
    // the reason none could be built is reported in the Modules section.
    let built = build_modules(udp.clone(), &params, cli.dump);
    let in_force = match &built {
        Ok(reports) => reports
            .first()
            .map(|r| in_force(r, &params))
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    if selected.is_empty() {
        providers(&mut out, &params)?;
        devices(&mut out, &udp, &params)?;
        rdma_devices(&mut out, &params)?;
        parameters(&mut out, &params.describe(), &in_force)?;
        other_variables(&mut out)?;
        let listed = modules(&mut out, built, &params);
        out.flush()?;
        listed?;
    } else {
        let selected: Vec<ParamInfo> = params
            .describe()
            .into_iter()
            .filter(|info| selected.contains(&info.name))
            .collect();
        parameters(&mut out, &selected, &in_force)?;
        out.flush()?;
        if let Err(err) = built {
            complain(format_args!("no module could be built: {err}"));
            return Err(Failure::NoModule);
        }
    }
    out.flush()?;
    Ok(())
}

// ----- command line and logging --------------------------------------------------

/// Reports a command-line error on one line and returns exit status 2;
/// `--help` and `--version` print to stdout and succeed.
fn usage(err: &clap::Error) -> ExitCode {
    if !err.use_stderr() {
        return match err.print() {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(1),
        };
    }
    let text = err.to_string();
    let first = text.lines().next().unwrap_or("bad command line");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let hint = match err.get(ContextKind::SuggestedArg) {
        Some(ContextValue::String(arg)) => format!("; did you mean {arg}?"),
        _ => String::new(),
    };
    let help = match err.kind() {
        // The parser's own message already says what to do.
        ErrorKind::ValueValidation => "",
        _ => " (see udinfo --help)",
    };
    complain(format_args!("{first}{hint}{help}"));
    ExitCode::from(2)
}

/// Writes one `udinfo: ...` line to stderr. A failure to write it is
/// ignored: there is nowhere left to report it.
fn complain(message: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr(), "udinfo: {message}");
}

/// `err` and its sources, `: `-separated.
fn chain(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    text
}

// ----- sections ------------------------------------------------------------------
