//! The `udp` provider: UD verbs over kernel UDP sockets.
//!
//! Each queue pair is one nonblocking UDP socket bound to the context's IP
//! address. Where verbs address a queue pair by (LID, QPN), this provider uses
//! (IP address, UDP port): an address handle holds the IP address and the QP
//! number is the socket's port. Every datagram carries the UD encapsulation
//! header of [`udbtl_wire::ud`] with the partition and queue keys the receiver
//! checks.
//!
//! Sends go out with `sendmmsg`, one system call per posted batch; equal-sized
//! datagrams to one destination are coalesced with UDP GSO (`UDP_SEGMENT`)
//! when the kernel supports it. Receives land in place in the posted buffers,
//! with `recvmmsg`, while [`Context::poll_cq`](crate::Context::poll_cq) runs.
//!
//! The kernel's refusals behave like a lossy wire: ENOBUFS, EAGAIN, EPERM (a
//! firewall drop on the output path) and ICMP errors make the datagram lost
//! and counted in
//! [`FabricStats::tx_kernel_drops`](crate::FabricStats::tx_kernel_drops); the
//! send still completes, as a UD send does once the datagram has left the HCA.
//!
//! This module holds the configuration and the provider, which chooses
//! interfaces (with `netif`) and opens contexts. The opened context and its
//! queue pairs are in `context`, posting sends in `send`, receiving in
//! `recv`; every system call that needs `unsafe` is in `sys`.

mod context;
mod netif;
mod recv;
mod segment;
mod send;
mod sys;
mod train;

pub use context::UdpContext;
pub use netif::{InterfaceScope, memory_domain};

use std::net::IpAddr;

use udbtl_wire::ud;

use crate::bookkeeping::Verbs;
use crate::{DeviceAttr, DeviceInfo, FabricError, NodeAddr, PortAttr, PortState, Provider, Result};

/// The provider's name.
pub const NAME: &str = "udp";

/// Largest UDP payload over IPv4 (65535 − 20 − 8).
const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload over IPv6 (65535 − 8; the IPv6 header is not counted).
const MAX_UDP_PAYLOAD_V6: usize = 65_527;
/// Most packets one GSO send may carry (the kernel's UDP_MAX_SEGMENTS).
const MAX_GSO_SEGMENTS: usize = 64;
/// Most gather entries a send may have besides the UD header.
const MAX_SEND_SGE: u32 = 8;

/// Configuration of the `udp` provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// Address to bind queue pairs to. Selects the device that holds it.
    pub bind: Option<IpAddr>,
    /// Interfaces to offer as devices, by name (`eth0`) or by a subnet one of
    /// their addresses is in (`10.77.0.0/24`). When empty, and `bind`
    /// is unset, [`scope`](Self::scope) chooses.
    pub interfaces: Vec<String>,
    /// Interfaces never to offer, by name or subnet, whatever chose them.
    pub exclude: Vec<String>,
    /// The interfaces offered when neither `interfaces` nor `bind` names
    /// any: loopback (the default, for a job on one host) or every other
    /// interface (for a job that spans hosts).
    pub scope: InterfaceScope,
    /// Prefer IPv6 addresses when choosing a device's address.
    pub ipv6: bool,
    /// Largest payload per datagram. Defaults to the largest datagram on
    /// loopback, and to the interface MTU less the IP and UDP headers
    /// elsewhere, so that IP never fragments.
    pub mtu: Option<usize>,
    /// Requested `SO_SNDBUF` in bytes.
    pub send_buffer: usize,
    /// Requested `SO_RCVBUF` in bytes.
    pub recv_buffer: usize,
    /// Coalesce equal-sized datagrams with UDP GSO.
    pub gso: bool,
    /// Receive coalesced trains with UDP GRO, and split them back into
    /// datagrams. Used where a train can form: on ports whose datagrams are
    /// at most half the largest UDP payload (an MTU-sized path, not
    /// loopback's 64 KiB datagrams).
    pub gro: bool,
    /// Carry datagrams longer than the path's MTU, cut into MTU-sized
    /// pieces that leave as one GSO send and that the receiver puts back
    /// together ([`udbtl_wire::segment`]): a port whose packets hold at
    /// most 9 000 bytes (an MTU-1500 or jumbo-frame path) then takes
    /// datagrams of up to 16 packets and one GSO send (23 408 bytes at MTU
    /// 1500, 62 748 at MTU 9000), and the layers above pay their
    /// per-datagram costs once per many packets. Needs `gso`. Off, a
    /// datagram is at most one packet.
    pub segment: bool,
    /// The UDP payload of each piece where it should not be the
    /// interface's (its MTU less the IP and UDP headers); set, ports on
    /// loopback segment too, which tests use to stand in for a real path.
    pub segment_wire: Option<usize>,
    /// Microseconds a receive on an empty socket may spend polling the
    /// device's queue itself (`SO_BUSY_POLL`), instead of waiting for the
    /// softirq to deliver; 0 leaves it off. Acts only on devices with NAPI
    /// receive queues; setting it needs `CAP_NET_ADMIN`, and a refusal
    /// leaves it off with a warning.
    pub busy_poll_us: u32,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self {
            bind: None,
            interfaces: Vec::new(),
            exclude: Vec::new(),
            scope: InterfaceScope::Loopback,
            ipv6: false,
            mtu: None,
            send_buffer: 4 << 20,
            recv_buffer: 4 << 20,
            gso: true,
            gro: true,
            segment: true,
            segment_wire: None,
            busy_poll_us: 0,
        }
    }
}

/// The `udp` provider.
#[derive(Debug, Clone, Default)]
pub struct UdpProvider {
    config: UdpConfig,
}

impl UdpProvider {
    /// A provider with the given configuration.
    pub const fn new(config: UdpConfig) -> Self {
        Self { config }
    }

    /// The configuration.
    pub const fn config(&self) -> &UdpConfig {
        &self.config
    }

    /// The entries of the configured `interfaces` (names or subnets) that
    /// match none of the host's interfaces, and the host's interfaces as
    /// `name (address, ...)`, for an error that names both.
    ///
    /// # Errors
    /// The interfaces could not be listed.
    pub fn unmatched_interfaces(&self) -> Result<(Vec<String>, Vec<String>)> {
        let all = sys::interfaces().map_err(|source| FabricError::Io {
            operation: "getifaddrs",
            source,
        })?;
        let missing = self
            .config
            .interfaces
            .iter()
            .filter(|wanted| {
                !all.iter()
                    .any(|iface| netif::interface_matches(iface, wanted))
            })
            .cloned()
            .collect();
        let present = all
            .iter()
            .map(|iface| {
                let addrs: Vec<String> = iface
                    .addrs
                    .iter()
                    .map(|(ip, prefix)| format!("{ip}/{prefix}"))
                    .collect();
                if addrs.is_empty() {
                    iface.name.clone()
                } else {
                    format!("{} ({})", iface.name, addrs.join(", "))
                }
            })
            .collect();
        Ok((missing, present))
    }

    fn selected_interfaces(&self) -> Result<Vec<sys::Interface>> {
        let all = sys::interfaces().map_err(|source| FabricError::Io {
            operation: "getifaddrs",
            source,
        })?;
        Ok(netif::select(
            all,
            netif::Selection {
                include: &self.config.interfaces,
                exclude: &self.config.exclude,
                bind: self.config.bind,
                scope: self.config.scope,
            },
        ))
    }

    /// The address (and prefix length) queue pairs of `iface` bind to.
    fn address_of(&self, iface: &sys::Interface) -> Option<(IpAddr, u8)> {
        if let Some(bind) = self.config.bind {
            return iface.addrs.iter().find(|(ip, _)| *ip == bind).copied();
        }
        let family = |(ip, _): &&(IpAddr, u8)| ip.is_ipv6() == self.config.ipv6;
        let usable = |(ip, _): &&(IpAddr, u8)| match ip {
            IpAddr::V6(v6) => !v6.is_unicast_link_local(),
            IpAddr::V4(_) => true,
        };
        iface.addrs.iter().filter(family).find(usable).copied()
    }

    /// The largest datagram payload of a port on `iface` at `ip`, and the
    /// UDP payload of the pieces its longer datagrams are cut into, if it
    /// segments.
    fn port_size(&self, iface: &sys::Interface, ip: IpAddr) -> Result<(usize, Option<usize>)> {
        let link = (!iface.loopback).then(|| {
            let link_mtu = std::fs::read_to_string(format!("/sys/class/net/{}/mtu", iface.name))
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .unwrap_or(1500);
            let ip_header = if ip.is_ipv6() { 40 } else { 20 };
            link_mtu.saturating_sub(ip_header + 8)
        });
        let packet = link.unwrap_or(if ip.is_ipv6() {
            MAX_UDP_PAYLOAD_V6
        } else {
            MAX_UDP_PAYLOAD_V4
        });
        let wire = if self.config.segment && self.config.gso {
            self.config.segment_wire.or(link).filter(|&w| w <= packet)
        } else {
            None
        };
        let pieces = wire.and_then(|w| segment::pieces_per_send(w).map(|n| (w, n)));
        let limit = match pieces {
            Some((wire, count)) => count * (wire - udbtl_wire::segment::HEADER_LEN),
            None => packet,
        };
        let limit = limit.saturating_sub(ud::HEADER_LEN);
        let size = match self.config.mtu {
            None => limit,
            Some(mtu) if mtu > 0 && mtu <= limit => mtu,
            Some(mtu) => {
                return Err(FabricError::InvalidArgument {
                    what: "udp mtu",
                    detail: format!("{mtu} is outside 1..={limit} for {}", iface.name),
                });
            }
        };
        Ok((size, pieces.map(|(wire, _)| wire)))
    }
}

fn device_attr() -> DeviceAttr {
    DeviceAttr {
        max_qp: 1024,
        max_qp_wr: 65_536,
        max_sge: MAX_SEND_SGE,
        max_cq: 1024,
        max_cqe: 1 << 20,
        max_mr: 1 << 16,
        max_ah: 1 << 20,
        max_inline_data: 1024,
    }
}

impl Provider for UdpProvider {
    type Context = UdpContext;

    fn name(&self) -> &'static str {
        NAME
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        Ok(self
            .selected_interfaces()?
            .into_iter()
            .map(|iface| DeviceInfo {
                name: iface.name,
                provider: NAME,
                port_count: 1,
                attr: device_attr(),
                sends_read_at_post: true,
            })
            .collect())
    }

    fn open(&self, device: &str) -> Result<UdpContext> {
        let iface = self
            .selected_interfaces()?
            .into_iter()
            .find(|iface| iface.name == device)
            .ok_or_else(|| FabricError::NoSuchDevice {
                provider: NAME,
                name: device.into(),
            })?;
        let addr = self.address_of(&iface);
        let (ip, prefix) = addr.unwrap_or(if self.config.ipv6 {
            (IpAddr::from([0u16; 8]), 0)
        } else {
            (IpAddr::from([0u8; 4]), 0)
        });
        let (max_msg_size, segment_wire) = self.port_size(&iface, ip)?;
        let packet_size =
            segment_wire.map_or(max_msg_size, |wire| max_msg_size.min(wire - ud::HEADER_LEN));
        let port = PortAttr {
            port_num: 1,
            state: if iface.up && addr.is_some() {
                PortState::Active
            } else {
                PortState::Down
            },
            addr: NodeAddr::Ip(ip),
            max_msg_size,
            packet_size,
            network: netif::network_id(&iface, ip, prefix, &netif::loopback_identity()),
            pkeys: vec![0xffff],
            link_layer: if ip.is_ipv6() { "udp/ipv6" } else { "udp/ipv4" },
        };
        let info = DeviceInfo {
            name: iface.name.clone(),
            provider: NAME,
            port_count: 1,
            attr: device_attr(),
            sends_read_at_post: true,
        };
        // A train forms only where two datagrams fit one UDP payload.
        let gro = self.config.gro && port.max_msg_size + ud::HEADER_LEN <= MAX_UDP_PAYLOAD_V4 / 2;
        // A segmenting port's pieces form trains whatever its datagrams.
        let gro = gro || (self.config.gro && segment_wire.is_some());
        Ok(UdpContext::new(
            Verbs::new(info, vec![port]),
            ip,
            self.config.clone(),
            gro,
            segment_wire,
        ))
    }
}
