//! The modules udbtl would build here, and the limits they would have.

use udbtl_btl::{Component, Limits, NUM_QP, Params, check_udp_settings};
use udbtl_fabric::udp::UdpProvider;
use udbtl_fabric::{GRH_LEN, PortAttr, udp};

use crate::listing::{Listing, Row, source};
use crate::{Failure, chain, complain};

/// The sizes one module uses, and its state for `--dump`.
pub(crate) struct ModuleReport {
    pub(crate) device: String,
    pub(crate) port: PortAttr,
    pub(crate) limits: Limits,
    /// The module's `Display`, when `--dump` asks for it.
    pub(crate) dump: Option<String>,
    /// Heap bytes per idle peer (`Module::bytes_per_idle_peer`).
    pub(crate) bytes_per_idle_peer: usize,
    /// Heap bytes per peer that talked (`Module::bytes_per_active_peer`).
    pub(crate) bytes_per_active_peer: usize,
    /// Buffers shared as credit, and the most the active peers share
    /// (`Module::credit_shares`); `None` when unreliable.
    pub(crate) credit: Option<(usize, usize)>,
}

/// Builds the modules on the `udp` provider, reads their sizes and
/// finalizes them; the error says why none could be built.
pub(crate) fn build_modules(
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
            bytes_per_idle_peer: module.bytes_per_idle_peer(),
            bytes_per_active_peer: module.bytes_per_active_peer(),
            credit: module.credit_shares(),
        })
        .collect();
    if let Err(err) = component.finalize() {
        complain(format_args!("finalizing the modules: {}", chain(&err)));
    }
    Ok(reports)
}

pub(crate) fn modules(
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
            out.field(&key("alloc_limit"), limits.alloc_limit)?;
            out.field(&key("frag_limit"), limits.frag_limit)?;
            out.field(&key("rndv_eager_limit"), limits.rndv_eager_limit)?;
            out.field(&key("inline_max"), limits.inline_max)?;
            out.field(&key("exclusivity"), limits.exclusivity)?;
            out.field(&key("bandwidth"), limits.bandwidth)?;
            out.field(&key("recv_buffers"), limits.recv_buffers)?;
            out.field(&key("recv_buffer_len"), limits.recv_buffer_len)?;
            out.field(&key("send_frags_max"), limits.send_frags_max)?;
            out.field(&key("bytes_per_idle_peer"), report.bytes_per_idle_peer)?;
            out.field(&key("bytes_per_active_peer"), report.bytes_per_active_peer)?;
            if let Some((shared, active_max)) = report.credit {
                out.field(&key("credit_shared"), shared)?;
                out.field(&key("credit_active_max"), active_max)?;
            }
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
pub(crate) fn limit_rows(report: &ModuleReport, params: &Params) -> Vec<Row> {
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
    let credit = match report.credit {
        Some((shared, active_max)) => indent([
            "credit".into(),
            shared.to_string(),
            format!(
                "receive buffers beyond the reserve, shared by need: the peers that send \
                 share half, {active_max} at most together; idle peers an even share of \
                 the rest, at least 1"
            ),
        ]),
        None => indent(["credit".into(), "-".into(), "unreliable: no credit".into()]),
    };
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
        credit,
        indent([
            "bytes_per_idle_peer".into(),
            report.bytes_per_idle_peer.to_string(),
            "heap bytes per peer never sent to or heard from (endpoint, index, where its \
             streams start; the fabric's address handle aside)"
                .into(),
        ]),
        indent([
            "bytes_per_active_peer".into(),
            report.bytes_per_active_peer.to_string(),
            "heap bytes per peer that talked (the above and its reliability state; \
             datagrams in flight take more)"
                .into(),
        ]),
    ]
}

// ----- formatting ----------------------------------------------------------------
