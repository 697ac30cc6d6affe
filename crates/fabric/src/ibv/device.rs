//! Device listing and opening for the `verbs` provider: [`VerbsConfig`],
//! [`VerbsProvider`] (the [`Provider`] implementation), reading a port's
//! attributes, GID and partition key tables ([`PortDetail`] for listings),
//! and building the [`VerbsContext`] of an opened device.

use std::collections::HashMap;

use super::context::{POLL_BATCH, VerbsContext};
use super::logic::{self, Gid, IBV_PORT_ACTIVE, LinkLayer, LocalPort, Mtu, Verb};
use super::sys::{self, Completion};
use crate::bookkeeping::Verbs;
use crate::{DeviceAttr, DeviceInfo, FabricError, NodeAddr, PortAttr, PortState, Provider, Result};

/// The provider's name.
pub const NAME: &str = "verbs";

/// Most GID table entries read per port.
const MAX_GIDS: u16 = 256;
/// Most partition key table entries read per port.
const MAX_PKEYS: u16 = 128;
/// Inline bytes the provider asks a queue pair for at most.
const MAX_INLINE: u32 = 256;

/// Configuration of the `verbs` provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerbsConfig {
    /// GID index to send from; `None` chooses as
    /// [`select_gid_index`](super::select_gid_index) does.
    pub gid_index: Option<u8>,
    /// Cap on the payload of one datagram (bytes); `None` uses the port's
    /// active MTU.
    pub mtu: Option<usize>,
}

/// The `verbs` provider: UD queue pairs on RDMA devices through libibverbs.
#[derive(Debug, Clone, Default)]
pub struct VerbsProvider {
    config: VerbsConfig,
}

impl VerbsProvider {
    /// A provider with the given configuration.
    pub const fn new(config: VerbsConfig) -> Self {
        Self { config }
    }

    /// The configuration.
    pub const fn config(&self) -> &VerbsConfig {
        &self.config
    }

    fn port_attr(&self, device: &sys::Device, name: &str, port: u8) -> Result<PortInfo> {
        let err = |errno| logic::errno_error(Verb::Query, errno, name);
        let raw = device.query_port(port).map_err(err)?;
        let link_layer = LinkLayer::from_ibv(raw.link_layer).unwrap_or(LinkLayer::InfiniBand);
        let gid_count = u16::try_from(raw.gid_tbl_len.max(0))
            .unwrap_or(MAX_GIDS)
            .min(MAX_GIDS);
        let gids: Vec<Gid> = (0..gid_count)
            .map(|i| device.query_gid(port, i).map(Gid).unwrap_or(Gid::ZERO))
            .collect();
        let pkeys: Vec<u16> = (0..raw.pkey_tbl_len.min(MAX_PKEYS))
            .map(|i| device.query_pkey(port, i).unwrap_or(0))
            .collect();
        let gid_index = logic::select_gid_index(&gids, link_layer, self.config.gid_index);
        let (gid_index, gid) = match gid_index {
            Ok(i) => (i, gids.get(usize::from(i)).copied().unwrap_or(Gid::ZERO)),
            // A port with no usable GID can still be listed; it is down.
            Err(_) => (0, Gid::ZERO),
        };
        let mtu = Mtu::from_ibv(raw.active_mtu).unwrap_or(Mtu::Mtu256);
        let max_msg_size = match self.config.mtu {
            Some(cap) if cap > 0 => cap.min(mtu.bytes()),
            _ => mtu.bytes(),
        };
        let usable = raw.state == IBV_PORT_ACTIVE
            && match link_layer {
                LinkLayer::InfiniBand => raw.lid != 0,
                LinkLayer::Ethernet => !gid.is_zero(),
            };
        Ok(PortInfo {
            attr: PortAttr {
                port_num: port,
                state: if usable {
                    PortState::Active
                } else {
                    PortState::Down
                },
                addr: NodeAddr::Ib {
                    lid: raw.lid,
                    gid: gid.raw(),
                },
                max_msg_size,
                packet_size: max_msg_size,
                network: logic::network_id(link_layer, gid),
                pkeys: if pkeys.is_empty() {
                    vec![0xffff]
                } else {
                    pkeys
                },
                link_layer: link_layer.name(),
            },
            local: LocalPort {
                port,
                link_layer,
                gid,
                gid_index,
            },
            mtu,
            gids,
        })
    }

    /// The ports of `name`, as [`Context::query_port`](crate::Context::query_port) would report them,
    /// with verbs details for listings (`udinfo`).
    ///
    /// # Errors
    /// [`FabricError::NoSuchDevice`], or a failed query.
    pub fn describe(&self, name: &str) -> Result<Vec<PortDetail>> {
        let (device, info) = self.open_raw(name)?;
        (1..=info.port_count)
            .map(|port| {
                let p = self.port_attr(&device, name, port)?;
                Ok(PortDetail {
                    attr: p.attr,
                    link_layer: p.local.link_layer,
                    active_mtu: p.mtu,
                    gid_index: p.local.gid_index,
                    gids: p.gids.into_iter().filter(|g| !g.is_zero()).collect(),
                })
            })
            .collect()
    }

    fn open_raw(&self, name: &str) -> Result<(sys::Device, DeviceInfo)> {
        let list = match sys::DeviceList::new() {
            Ok(list) => list,
            // No RDMA support in the kernel: no device of any name.
            Err(libc::ENOSYS | libc::ENODEV | libc::ENOENT) => {
                return Err(FabricError::NoSuchDevice {
                    provider: NAME,
                    name: name.into(),
                });
            }
            Err(errno) => return Err(list_error(errno)),
        };
        let device = list
            .open(name)
            .map_err(|errno| logic::errno_error(Verb::OpenDevice, errno, name))?
            .ok_or_else(|| FabricError::NoSuchDevice {
                provider: NAME,
                name: name.into(),
            })?;
        let raw = device
            .query_device()
            .map_err(|errno| logic::errno_error(Verb::Query, errno, name))?;
        let info = DeviceInfo {
            name: name.into(),
            provider: NAME,
            port_count: u8::try_from(raw.phys_port_cnt).unwrap_or(u8::MAX),
            attr: DeviceAttr {
                max_qp: raw.max_qp,
                max_qp_wr: raw.max_qp_wr,
                max_sge: raw.max_sge,
                max_cq: raw.max_cq,
                max_cqe: raw.max_cqe,
                max_mr: raw.max_mr,
                max_ah: raw.max_ah,
                max_inline_data: MAX_INLINE,
            },
            sends_read_at_post: false,
        };
        Ok((device, info))
    }
}

/// What a listing shows of one port.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortDetail {
    /// As [`Context::query_port`](crate::Context::query_port) reports it.
    pub attr: PortAttr,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// The GID index the provider sends from.
    pub gid_index: u8,
    /// The port's non-empty GIDs.
    pub gids: Vec<Gid>,
}

fn list_error(errno: sys::Errno) -> FabricError {
    FabricError::Io {
        operation: "ibv_get_device_list",
        source: std::io::Error::from_raw_os_error(errno),
    }
}

#[derive(Debug, Clone)]
struct PortInfo {
    attr: PortAttr,
    local: LocalPort,
    mtu: Mtu,
    gids: Vec<Gid>,
}

impl Provider for VerbsProvider {
    type Context = VerbsContext;

    fn name(&self) -> &'static str {
        NAME
    }

    /// Every device libibverbs lists that opens and answers
    /// `ibv_query_device`; an empty list when there are none (or the
    /// kernel has no RDMA support: `ENOSYS`).
    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let list = match sys::DeviceList::new() {
            Ok(list) => list,
            Err(libc::ENOSYS | libc::ENODEV | libc::ENOENT) => return Ok(Vec::new()),
            Err(errno) => return Err(list_error(errno)),
        };
        let names = list.names();
        drop(list);
        Ok(names
            .iter()
            .filter_map(|name| match self.open_raw(name) {
                Ok((_, info)) => Some(info),
                Err(err) => {
                    tracing::warn!(device = %name, %err, "skipping an RDMA device that does not open");
                    None
                }
            })
            .collect())
    }

    fn open(&self, name: &str) -> Result<VerbsContext> {
        let (device, info) = self.open_raw(name)?;
        let ports: Vec<PortInfo> = (1..=info.port_count)
            .map(|port| self.port_attr(&device, name, port))
            .collect::<Result<_>>()?;
        let max_payload = ports
            .iter()
            .map(|p| p.attr.max_msg_size)
            .max()
            .unwrap_or(Mtu::Mtu256.bytes());
        let attrs = ports.iter().map(|p| p.attr.clone()).collect();
        Ok(VerbsContext {
            verbs: Verbs::new(info, attrs),
            locals: ports.iter().map(|p| p.local).collect(),
            max_payload,
            pds: HashMap::new(),
            cqs: HashMap::new(),
            qps: HashMap::new(),
            qp_nums: HashMap::new(),
            peers_by_lid: HashMap::new(),
            lids_by_gid: HashMap::new(),
            polls: 0,
            fatal: None,
            scratch: vec![Completion::default(); POLL_BATCH],
            device,
        })
    }
}
