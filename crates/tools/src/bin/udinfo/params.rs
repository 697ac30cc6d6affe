//! The parameters with their values in force, and the other variables.

use std::io;

use udbtl_btl::Params;
use udbtl_btl::params::ParamInfo;
use udbtl_btl::params::env::{OTHER_VARS, VarUse};

use crate::listing::{HELP_WIDTH, Listing, Row, source, wrap};
use crate::modules::ModuleReport;

/// A parameter whose module uses another value than the one asked for:
/// (name, value in force, why).
pub(crate) type InForce = (&'static str, String, String);

/// The values the first module uses where they differ from the parameters.
pub(crate) fn in_force(report: &ModuleReport, params: &Params) -> Vec<InForce> {
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

pub(crate) fn parameters(
    out: &mut Listing<'_>,
    infos: &[ParamInfo],
    in_force: &[InForce],
) -> io::Result<()> {
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
pub(crate) fn other_variables(out: &mut Listing<'_>) -> io::Result<()> {
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
