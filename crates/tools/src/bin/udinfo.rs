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
//! `--param NAME` prints that parameter only, with its value in force;
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
use std::fmt::{self, Display};
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use clap::Parser;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use udbtl_btl::params::env::{self, OTHER_VARS, VarUse};
use udbtl_btl::params::{ParamError, ParamInfo, Source};
use udbtl_btl::{BtlConfig, Component, Limits, NUM_QP, Params, check_udp_settings, udp_config};
use udbtl_fabric::udp::{UdpConfig, UdpProvider};
use udbtl_fabric::{Context, GRH_LEN, PortAttr, PortState, Provider, sim, udp};

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
    /// Show only parameter NAME (sd_num, UDBTL_SD_NUM or btl_ofud_sd_num).
    /// May be repeated.
    #[arg(long, value_name = "NAME", value_parser = parameter_name)]
    param: Vec<&'static str>,

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
    // Warnings at least (a port skipped while building modules), or what
    // RUST_LOG asks for.
    udbtl::log_to_stderr();
    match run(&cli) {
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

fn run(cli: &Cli) -> Result<(), Failure> {
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
    if cli.param.is_empty() {
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
            .filter(|info| cli.param.contains(&info.name))
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

/// Accepts a parameter's name, its environment variable or the seed's MCA
/// name, in any case, and returns the name.
fn parameter_name(text: &str) -> Result<&'static str, String> {
    let lower = text.trim().to_ascii_lowercase();
    let bare = ["udbtl_", "btl_ofud_"]
        .iter()
        .find_map(|prefix| lower.strip_prefix(prefix))
        .unwrap_or(&lower);
    Params::default()
        .describe()
        .into_iter()
        .map(|info| info.name)
        .find(|name| *name == bare)
        .ok_or_else(|| "no such parameter; udinfo without --param lists them".to_owned())
}

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

fn providers(out: &mut Listing<'_>, params: &Params) -> io::Result<()> {
    let rows = [
        (
            udp::NAME,
            "real",
            "UD verbs over kernel UDP sockets: (IP, UDP port) stands for (LID, QPN)",
        ),
        (
            sim::PROVIDER_NAME,
            "simulated",
            "in-process fabric on virtual time for tests; no devices outside a test",
        ),
        (
            udbtl_fabric::ibv::NAME,
            "real",
            if udbtl_fabric::ibv::AVAILABLE {
                "UD verbs on InfiniBand/RoCE devices through libibverbs"
            } else {
                "UD verbs on InfiniBand/RoCE devices (not built in: the verbs feature is off)"
            },
        ),
    ];
    let selected = |name: &str| match (params.provider == name, name == sim::PROVIDER_NAME) {
        (true, true) => "yes (refused: a job cannot run on it)",
        (true, false) => "yes",
        (false, _) => "no",
    };
    if out.parsable {
        for (name, kind, about) in rows {
            out.field(&["provider", name, "kind"], kind)?;
            out.field(&["provider", name, "selected"], selected(name))?;
            out.field(&["provider", name, "about"], about)?;
        }
        return Ok(());
    }
    out.heading("Providers", "selected: named by the provider parameter")?;
    let mut table = vec![Row::new(["name", "kind", "selected", "about"])];
    table.extend(
        rows.iter()
            .map(|(name, kind, about)| Row::new([*name, *kind, selected(name), *about])),
    );
    out.table(&table)
}

/// One port of a `udp` device, as the provider reports it.
struct Port {
    device: String,
    num: u8,
    attr: Result<PortAttr, String>,
    /// Whether the component may build a module on it, and if not why.
    eligible: &'static str,
}

fn devices(out: &mut Listing<'_>, udp: &UdpProvider, params: &Params) -> io::Result<()> {
    let ports = match udp.devices() {
        Ok(devices) => {
            let mut ports = Vec::new();
            let mut modules = 0;
            for device in devices {
                let ctx = udp.open(&device.name).map_err(|e| chain(&e));
                for num in 1..=device.port_count {
                    let attr = match &ctx {
                        Ok(ctx) => ctx.query_port(num).map_err(|e| chain(&e)),
                        Err(err) => Err(err.clone()),
                    };
                    let eligible = eligibility(params, &device.name, num, &attr, &mut modules);
                    ports.push(Port {
                        device: device.name.clone(),
                        num,
                        attr,
                        eligible,
                    });
                }
            }
            ports
        }
        Err(err) => {
            out.flush()?;
            complain(format_args!("cannot list the udp devices: {}", chain(&err)));
            Vec::new()
        }
    };
    if out.parsable {
        for port in &ports {
            let num = port.num.to_string();
            let key = |field| ["device", port.device.as_str(), num.as_str(), field];
            match &port.attr {
                Ok(attr) => {
                    out.field(&key("state"), state(attr.state))?;
                    out.field(&key("address"), attr.addr)?;
                    out.field(&key("max_msg_size"), attr.max_msg_size)?;
                    out.field(&key("link_layer"), attr.link_layer)?;
                    out.field(&key("network"), format_args!("{:#018x}", attr.network))?;
                }
                Err(err) => out.field(&key("error"), err)?,
            }
            out.field(&key("eligible"), port.eligible)?;
        }
        return Ok(());
    }
    out.heading("Devices of provider udp", &udp_settings(udp.config()))?;
    if ports.is_empty() {
        return out.line("  (none)");
    }
    let mut table = vec![Row::new([
        "device",
        "port",
        "state",
        "address",
        "max_msg_size",
        "link layer",
        "network",
        "eligible",
    ])];
    for port in &ports {
        table.push(match &port.attr {
            Ok(attr) => Row::new([
                port.device.clone(),
                port.num.to_string(),
                state(attr.state).to_owned(),
                attr.addr.to_string(),
                attr.max_msg_size.to_string(),
                attr.link_layer.to_owned(),
                format!("{:#018x}", attr.network),
                port.eligible.to_owned(),
            ]),
            Err(err) => Row::new([
                port.device.clone(),
                port.num.to_string(),
                "error".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                port.eligible.to_owned(),
            ])
            .note(err),
        });
    }
    out.table(&table)
}

/// Why a module may or may not be built on a port, in the order
/// [`Component::init`] decides it; `modules` counts the eligible ports so far.
/// The verbs devices and ports, or why there are none.
fn rdma_devices(out: &mut Listing<'_>, params: &Params) -> io::Result<()> {
    let listed = rdma_ports(params);
    if out.parsable {
        return match &listed {
            Ok(rows) => {
                for row in rows {
                    out.field(&["verbs", &row[0], &row[1], "port"], row[2..].join(" "))?;
                }
                Ok(())
            }
            Err(why) => out.field(&["verbs", "none"], why),
        };
    }
    out.heading("RDMA devices", "the verbs provider's devices and ports")?;
    match listed {
        Ok(rows) => {
            let mut table = vec![Row::new([
                "device",
                "port",
                "state",
                "link",
                "lid",
                "mtu",
                "gid index",
                "gid",
                "eligible",
            ])];
            table.extend(rows.into_iter().map(Row::new));
            out.table(&table)
        }
        Err(why) => out.line(&format!("  no RDMA devices: {why}")),
    }
}

#[cfg(not(feature = "verbs"))]
fn rdma_ports(_params: &Params) -> Result<Vec<[String; 9]>, String> {
    Err("the verbs provider is not built in (build udbtl-tools with --features verbs)".into())
}

#[cfg(feature = "verbs")]
fn rdma_ports(params: &Params) -> Result<Vec<[String; 9]>, String> {
    use udbtl_fabric::ibv::VerbsProvider;
    let verbs = VerbsProvider::new(udbtl_btl::verbs_config(params));
    let devices = verbs.devices().map_err(|e| chain(&e))?;
    if devices.is_empty() {
        return Err("libibverbs found no devices".into());
    }
    let mut rows = Vec::new();
    let mut modules = 0;
    for device in devices {
        match verbs.describe(&device.name) {
            Ok(ports) => {
                for port in ports {
                    let num = port.attr.port_num;
                    let lid = match port.attr.addr {
                        udbtl_fabric::NodeAddr::Ib { lid, .. } => lid.to_string(),
                        other => other.to_string(),
                    };
                    let state = format!("{:?}", port.attr.state).to_lowercase();
                    let gid = port
                        .gids
                        .get(usize::from(port.gid_index))
                        .map_or_else(|| "-".into(), ToString::to_string);
                    let attr = Ok(port.attr);
                    let eligible = eligibility(params, &device.name, num, &attr, &mut modules);
                    rows.push([
                        device.name.clone(),
                        num.to_string(),
                        state,
                        port.link_layer.name().into(),
                        lid,
                        port.active_mtu.to_string(),
                        port.gid_index.to_string(),
                        gid,
                        eligible.into(),
                    ]);
                }
            }
            Err(err) => rows.push([
                device.name.clone(),
                "-".into(),
                chain(&err),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                "no".into(),
            ]),
        }
    }
    Ok(rows)
}

fn eligibility(
    params: &Params,
    device: &str,
    port: u8,
    attr: &Result<PortAttr, String>,
    modules: &mut u32,
) -> &'static str {
    if *modules >= params.max_btls {
        "no (max_btls)"
    } else if !params.port_allowed(device, port) {
        if params.if_include.is_some() {
            "no (not in if_include)"
        } else {
            "no (in if_exclude)"
        }
    } else {
        match attr {
            Err(_) => "no (error)",
            Ok(attr) if attr.state != PortState::Active => "no (down)",
            Ok(_) => {
                *modules += 1;
                "yes"
            }
        }
    }
}

const fn state(state: PortState) -> &'static str {
    match state {
        PortState::Active => "active",
        PortState::Down => "down",
    }
}

/// The `udp` provider configuration, and which parameters chose it.
fn udp_settings(config: &UdpConfig) -> String {
    let interfaces = if config.interfaces.is_empty() {
        "interfaces: loopback (if_include unset: a job on one host; a job across hosts uses every \
         other interface)"
            .to_owned()
    } else {
        format!(
            "interfaces: {} from if_include",
            config.interfaces.join(",")
        )
    };
    let family = if config.ipv6 { "IPv6" } else { "IPv4" };
    let mtu = match config.mtu {
        Some(mtu) => format!("mtu {mtu} from udp_mtu"),
        None => "mtu from the interface".to_owned(),
    };
    format!("{interfaces}; {family}; {mtu}")
}

/// A parameter whose module uses another value than the one asked for:
/// (name, value in force, why).
type InForce = (&'static str, String, String);

/// The values the first module uses where they differ from the parameters.
fn in_force(report: &ModuleReport, params: &Params) -> Vec<InForce> {
    let limits = &report.limits;
    let port = format!("{}:{}", report.device, report.port.port_num);
    let mut found = Vec::new();
    if limits.recv_buffers != params.rd_num as usize {
        found.push((
            "rd_num",
            limits.recv_buffers.to_string(),
            format!(
                "{} buffers of {} bytes posted on {port}: lowered to fit rd_mem",
                limits.recv_buffers, limits.recv_buffer_len
            ),
        ));
    }
    if limits.send_frags_max != params.send_frags_max {
        found.push((
            "send_frags_max",
            limits.send_frags_max.to_string(),
            format!("on {port}: lowered to fit send_mem"),
        ));
    }
    let datagram = limits.eager_limit + limits.header_len;
    if params.max_send_size.is_some_and(|asked| asked != datagram) {
        found.push((
            "max_send_size",
            datagram.to_string(),
            format!(
                "the largest datagram of {port} ({}): eager limit {}",
                report.port.max_msg_size, limits.eager_limit
            ),
        ));
    }
    if params
        .min_send_size
        .is_some_and(|asked| asked != limits.rndv_eager_limit)
    {
        found.push((
            "min_send_size",
            limits.rndv_eager_limit.to_string(),
            format!("the eager limit of {port}"),
        ));
    }
    found
}

fn parameters(out: &mut Listing<'_>, infos: &[ParamInfo], in_force: &[InForce]) -> io::Result<()> {
    let origin = |info: &ParamInfo| if info.from_seed { "btl_ofud" } else { "udbtl" };
    let forced = |name: &str| in_force.iter().find(|(n, _, _)| *n == name);
    if out.parsable {
        for info in infos {
            let key = |field| ["param", info.name, field];
            out.field(&key("value"), &info.value)?;
            if let Some((_, value, why)) = forced(info.name) {
                out.field(&key("in_force"), value)?;
                out.field(&key("in_force_why"), why)?;
            }
            out.field(&key("default"), &info.default)?;
            out.field(&key("source"), info.source)?;
            out.field(&key("env"), &info.env_var)?;
            out.field(&key("origin"), origin(info))?;
            out.field(&key("syntax"), &info.syntax)?;
            out.field(&key("help"), info.help)?;
        }
        return Ok(());
    }
    out.heading(
        "Parameters",
        "origin btl_ofud: the seed's btl_ofud_<name>; udbtl: added by udbtl",
    )?;
    let mut table = vec![Row::new([
        "name", "value", "default", "source", "origin", "env var",
    ])];
    for info in infos {
        let mut row = Row::new([
            info.name,
            info.value.as_str(),
            info.default.as_str(),
            source(info.source),
            origin(info),
            info.env_var.as_str(),
        ]);
        if let Some((_, value, why)) = forced(info.name) {
            row = row.note(format!("in force: {value} ({why})"));
        }
        for line in wrap(&format!("{} [{}]", info.help, info.syntax), HELP_WIDTH) {
            row = row.note(line);
        }
        table.push(row);
    }
    out.table(&table)
}

/// The `UDBTL_*` variables that are not parameters, with their values.
fn other_variables(out: &mut Listing<'_>) -> io::Result<()> {
    let runtime = OTHER_VARS.iter().filter(|var| var.used == VarUse::Runtime);
    let value = |name: &str| match std::env::var_os(name) {
        None => "unset".to_owned(),
        // A secret is never printed: only whether it is there.
        Some(_) if name == udbtl_pmi::auth::SECRET_ENV => "set (not shown)".to_owned(),
        Some(v) => v.to_string_lossy().into(),
    };
    if out.parsable {
        for var in runtime {
            out.field(&["env", var.name, "value"], value(var.name))?;
            out.field(&["env", var.name, "help"], var.help)?;
        }
        return Ok(());
    }
    out.heading("Other variables", "read by udbtl besides the parameters")?;
    let mut table = vec![Row::new(["variable", "value"])];
    for var in runtime {
        let mut row = Row::new([var.name.to_owned(), value(var.name)]);
        for line in wrap(var.help, HELP_WIDTH) {
            row = row.note(line);
        }
        table.push(row);
    }
    out.table(&table)
}

const fn source(source: Source) -> &'static str {
    match source {
        Source::Default => "default",
        Source::Config => "config",
        Source::Environment => "environment",
    }
}

/// The sizes one module uses, and its state for `--dump`.
struct ModuleReport {
    device: String,
    port: PortAttr,
    limits: Limits,
    /// The module's `Display`, when `--dump` asks for it.
    dump: Option<String>,
}

/// Builds the modules on the `udp` provider, reads their sizes and
/// finalizes them; the error says why none could be built.
fn build_modules(
    udp: UdpProvider,
    params: &Params,
    dump: bool,
) -> Result<Vec<ModuleReport>, String> {
    check_udp_settings(&udp, params).map_err(|err| err.to_string())?;
    let component = Component::init(udp, params.clone()).map_err(|err| chain(&err))?;
    let reports: Vec<ModuleReport> = component
        .modules()
        .iter()
        .map(|module| ModuleReport {
            device: module.device().to_owned(),
            port: module.port().clone(),
            limits: module.limits(),
            dump: dump.then(|| module.to_string()),
        })
        .collect();
    if let Err(err) = component.finalize() {
        complain(format_args!("finalizing the modules: {}", chain(&err)));
    }
    Ok(reports)
}

fn modules(
    out: &mut Listing<'_>,
    built: Result<Vec<ModuleReport>, String>,
    params: &Params,
) -> Result<(), Failure> {
    let (reports, failed) = match built {
        Ok(reports) => (reports, false),
        Err(err) => {
            out.flush()?;
            complain(format_args!("no module could be built: {err}"));
            (Vec::new(), true)
        }
    };
    if out.parsable {
        for report in &reports {
            let num = report.port.port_num.to_string();
            let key = |field| ["module", report.device.as_str(), num.as_str(), field];
            let limits = &report.limits;
            out.field(&key("eager_limit"), limits.eager_limit)?;
            out.field(&key("max_send_size"), limits.max_send_size)?;
            out.field(&key("rndv_eager_limit"), limits.rndv_eager_limit)?;
            out.field(&key("inline_max"), limits.inline_max)?;
            out.field(&key("exclusivity"), limits.exclusivity)?;
            out.field(&key("bandwidth"), limits.bandwidth)?;
            out.field(&key("recv_buffers"), limits.recv_buffers)?;
            out.field(&key("recv_buffer_len"), limits.recv_buffer_len)?;
            out.field(&key("send_frags_max"), limits.send_frags_max)?;
            for line in report.dump.iter().flat_map(|text| text.lines()) {
                out.field(&key("dump"), line)?;
            }
        }
        return if failed {
            Err(Failure::NoModule)
        } else {
            Ok(())
        };
    }
    let detail = if params.provider == udp::NAME {
        "built on provider udp with these parameters, then finalized".to_owned()
    } else {
        format!(
            "built on provider udp with these parameters, then finalized; \
             provider {} has no devices outside a test",
            params.provider
        )
    };
    out.heading("Modules", &detail)?;
    if reports.is_empty() {
        out.line("  (none: see the error above)")?;
        return Err(Failure::NoModule);
    }
    for (i, report) in reports.iter().enumerate() {
        if i > 0 {
            out.line("")?;
        }
        let port = &report.port;
        out.line(&format!(
            "  {}:{}  {}, {}, max_msg_size {}",
            report.device, port.port_num, port.link_layer, port.addr, port.max_msg_size
        ))?;
        out.table(&limit_rows(report, params))?;
        if let Some(text) = &report.dump {
            out.line("    btl_dump:")?;
            for line in text.lines() {
                out.line(&format!("      {line}"))?;
            }
        }
    }
    Ok(())
}

/// The limits of one module, each with where its value comes from.
fn limit_rows(report: &ModuleReport, params: &Params) -> Vec<Row> {
    let limits = &report.limits;
    let port_max = report.port.max_msg_size;
    let from = |name: &str| params.source(name).map_or("?", source);
    let header = limits.header_len;
    let eager = match params.max_send_size {
        None => format!(
            "max_send_size unset: the port's max_msg_size {port_max} \
             less the {header}-byte BTL header"
        ),
        Some(asked) if asked > port_max => format!(
            "max_send_size {asked} ({}) exceeds the port's max_msg_size {port_max}, \
             which is used, less the {header}-byte BTL header",
            from("max_send_size")
        ),
        Some(asked) => format!(
            "max_send_size {asked} ({}) less the {header}-byte BTL header",
            from("max_send_size")
        ),
    };
    let rndv = match params.min_send_size {
        None => "min_send_size unset: the eager limit".to_owned(),
        Some(asked) if asked > limits.eager_limit => format!(
            "min_send_size {asked} ({}) exceeds the eager limit, which is used",
            from("min_send_size")
        ),
        Some(_) => format!("min_send_size ({})", from("min_send_size")),
    };
    let recv_len = limits.recv_buffer_len;
    let recv_total = recv_len * limits.recv_buffers;
    let recv_why = if limits.recv_buffers < params.rd_num as usize {
        format!(
            "rd_num {} ({}) lowered to fit rd_mem {} bytes",
            params.rd_num,
            from("rd_num"),
            params.rd_mem
        )
    } else {
        format!("rd_num ({})", from("rd_num"))
    };
    let indent = |cells: [String; 3]| Row::new(cells).indent(4);
    vec![
        indent(["eager_limit".into(), limits.eager_limit.to_string(), eager]),
        indent([
            "max_send_size".into(),
            limits.max_send_size.to_string(),
            "largest payload of one fragment: the eager limit".into(),
        ]),
        indent([
            "rndv_eager_limit".into(),
            limits.rndv_eager_limit.to_string(),
            rndv,
        ]),
        indent([
            "inline_max".into(),
            limits.inline_max.to_string(),
            format!("smallest inline grant of the {NUM_QP} queue pairs"),
        ]),
        indent([
            "exclusivity".into(),
            limits.exclusivity.to_string(),
            format!("exclusivity ({})", from("exclusivity")),
        ]),
        indent([
            "bandwidth".into(),
            limits.bandwidth.to_string(),
            format!("MB/s, bandwidth ({})", from("bandwidth")),
        ]),
        indent([
            "recv_buffers".into(),
            limits.recv_buffers.to_string(),
            format!(
                "{recv_why}, {recv_len} bytes each ({GRH_LEN}-byte GRH + BTL header + \
                 max_send_size, aligned): {:.1} MiB registered",
                recv_total as f64 / f64::from(1 << 20)
            ),
        ]),
    ]
}

// ----- formatting ----------------------------------------------------------------

/// Help lines are wrapped to this many characters.
const HELP_WIDTH: usize = 76;

/// Where the listing goes, and in which form.
struct Listing<'a> {
    out: BufWriter<io::StdoutLock<'a>>,
    parsable: bool,
    /// Headings written so far.
    sections: usize,
}

impl Listing<'_> {
    /// A section heading, after a blank line unless it is the first.
    fn heading(&mut self, title: &str, detail: &str) -> io::Result<()> {
        if self.sections > 0 {
            writeln!(self.out)?;
        }
        self.sections += 1;
        writeln!(self.out, "{title}  ({detail})")
    }

    fn line(&mut self, text: &str) -> io::Result<()> {
        writeln!(self.out, "{text}")
    }

    /// A parsable line: the keys, then the value, `:`-separated.
    fn field(&mut self, keys: &[&str], value: impl Display) -> io::Result<()> {
        writeln!(self.out, "{}:{value}", keys.join(":"))
    }

    /// Writes rows as columns two spaces apart; the last column is not
    /// padded. A row's notes follow it on their own lines.
    fn table(&mut self, rows: &[Row]) -> io::Result<()> {
        let mut widths: Vec<usize> = Vec::new();
        for row in rows {
            for (i, cell) in row.cells.iter().enumerate() {
                let len = cell.chars().count();
                match widths.get_mut(i) {
                    Some(width) => *width = (*width).max(len),
                    None => widths.push(len),
                }
            }
        }
        for row in rows {
            let mut line = " ".repeat(row.indent);
            for (i, cell) in row.cells.iter().enumerate() {
                if i + 1 == row.cells.len() {
                    line.push_str(cell);
                } else {
                    let width = widths.get(i).copied().unwrap_or(0);
                    line.push_str(&format!("{cell:<width$}  "));
                }
            }
            writeln!(self.out, "{}", line.trim_end())?;
            for note in &row.notes {
                writeln!(self.out, "{}{note}", " ".repeat(row.indent + 4))?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// One line of a table, with notes printed under it.
struct Row {
    cells: Vec<String>,
    notes: Vec<String>,
    indent: usize,
}

impl Row {
    fn new<S: ToString>(cells: impl IntoIterator<Item = S>) -> Self {
        Self {
            cells: cells.into_iter().map(|c| c.to_string()).collect(),
            notes: Vec::new(),
            indent: 2,
        }
    }

    fn note(mut self, text: impl Into<String>) -> Self {
        self.notes.push(text.into());
        self
    }

    const fn indent(mut self, indent: usize) -> Self {
        self.indent = indent;
        self
    }
}

/// Splits `text` into lines of at most `width` characters at spaces (a
/// longer word gets a line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}
