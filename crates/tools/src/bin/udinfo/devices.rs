//! The providers, the udp provider's devices and the RDMA devices: what
//! udbtl would open on this host, and why a port would not be used.

use std::io;

use udbtl_btl::Params;
use udbtl_fabric::udp::{UdpConfig, UdpProvider};
use udbtl_fabric::{Context, PortAttr, PortState, Provider, sim, udp};

use crate::listing::{Listing, Row};
use crate::{chain, complain};

pub(crate) fn providers(out: &mut Listing<'_>, params: &Params) -> io::Result<()> {
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
pub(crate) struct Port {
    pub(crate) device: String,
    pub(crate) num: u8,
    pub(crate) attr: Result<PortAttr, String>,
    /// Whether the component may build a module on it, and if not why.
    pub(crate) eligible: &'static str,
}

pub(crate) fn devices(out: &mut Listing<'_>, udp: &UdpProvider, params: &Params) -> io::Result<()> {
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
                    out.field(&key("packet_size"), attr.packet_size)?;
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
        "packet",
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
                attr.packet_size.to_string(),
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
                "-".to_owned(),
                port.eligible.to_owned(),
            ])
            .note(err),
        });
    }
    out.table(&table)
}

/// Why a module may or may not be built on a port, in the order
/// [`Component::init`](udbtl_btl::Component::init) decides it; `modules` counts the eligible ports so far.
/// The verbs devices and ports, or why there are none.
pub(crate) fn rdma_devices(out: &mut Listing<'_>, params: &Params) -> io::Result<()> {
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
pub(crate) fn rdma_ports(_params: &Params) -> Result<Vec<[String; 9]>, String> {
    Err("the verbs provider is not built in (build udbtl-tools with --features verbs)".into())
}

#[cfg(feature = "verbs")]
pub(crate) fn rdma_ports(params: &Params) -> Result<Vec<[String; 9]>, String> {
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

pub(crate) fn eligibility(
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

pub(crate) const fn state(state: PortState) -> &'static str {
    match state {
        PortState::Active => "active",
        PortState::Down => "down",
    }
}

/// The `udp` provider configuration, and which parameters chose it.
pub(crate) fn udp_settings(config: &UdpConfig) -> String {
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
    let pieces = if config.segment && config.gso {
        "datagrams cut into packet-sized pieces where packets hold at most 4 KiB"
    } else {
        "a datagram is one packet (udp_segment off)"
    };
    format!("{interfaces}; {family}; {mtu}; {pieces}")
}
