//! A deterministic in-process fabric on virtual time.
//!
//! A [`SimNetwork`] holds a clock, the ports of every simulated device, the
//! per-link fault model ([`LinkConfig`]) and the datagrams in flight. Hosts
//! are [`SimProvider`]s: each owns some devices of the network, and opening
//! one gives a [`SimContext`] that implements [`Context`](crate::Context) with the shared
//! verbs bookkeeping, so it refuses exactly what the other providers refuse.
//!
//! ```
//! use std::time::Duration;
//! use udbtl_fabric::sim::{LinkConfig, SimNetwork};
//! use udbtl_fabric::{Context, Provider};
//!
//! let net = SimNetwork::new(7);
//! let host = net.add_device("sim0", 1)?;
//! let ctx = host.open("sim0")?;
//! let port = ctx.query_port(1)?;
//! net.set_default_link(LinkConfig { latency: Duration::from_micros(2), ..LinkConfig::default() })?;
//! assert_eq!(port.max_msg_size, 4096);
//! # Ok::<(), udbtl_fabric::FabricError>(())
//! ```
//!
//! # Model
//!
//! * Each port has a network-wide id, its [`NodeAddr::Sim`] address (the
//!   LID). Queue pair numbers are network-wide too, start at `0x100` and are
//!   never reused.
//! * A send is complete when it is posted: the bytes are copied, faults are
//!   drawn, and what survives is queued with its arrival time (now + link
//!   latency, plus a reordering delay if one was drawn).
//! * Datagrams are delivered while the destination context polls the
//!   receive completion queue of the destination queue pair, in order of
//!   (arrival time, send order), and only while that completion queue has
//!   room; the rest stay in flight for a later poll.
//! * Time moves only when the test says so ([`SimNetwork::advance`],
//!   [`SimNetwork::advance_to`]); [`SimNetwork::next_arrival`] tells how far
//!   to jump.

mod context;
mod link;
mod network;
mod spec;

pub use context::SimContext;
pub use link::LinkConfig;
pub use network::{SimNetStats, SimNetwork};
pub use spec::SimDeviceSpec;

use crate::types::{DeviceAttr, DeviceInfo};
use crate::{FabricError, NodeAddr, Provider, Result};

/// The provider name every simulated device reports.
pub const PROVIDER_NAME: &str = "sim";

/// Maximum message size of a simulated port unless its device says otherwise.
pub const DEFAULT_MAX_MSG_SIZE: usize = 4096;

/// Limits of every simulated device.
pub(crate) const DEVICE_ATTR: DeviceAttr = DeviceAttr {
    max_qp: 1024,
    max_qp_wr: 65536,
    max_sge: 8,
    max_cq: 1024,
    max_cqe: 1 << 20,
    max_mr: 65536,
    max_ah: 1 << 20,
    max_inline_data: 1024,
};

/// A host on a [`SimNetwork`]: owns devices and opens them.
///
/// Create one with [`SimNetwork::provider`] (no devices) or
/// [`SimNetwork::add_device`] (one device), then add devices with
/// [`add_device`](Self::add_device). Clones share the same devices.
#[derive(Debug, Clone)]
pub struct SimProvider {
    net: SimNetwork,
    id: u32,
}

impl SimProvider {
    pub(crate) const fn new(net: SimNetwork, id: u32) -> Self {
        Self { net, id }
    }

    /// Adds a device to this provider and returns the ids of its ports, in
    /// port order (port 1 first). Every port starts
    /// [`Active`](crate::PortState::Active).
    ///
    /// # Errors
    /// [`FabricError::InvalidArgument`] for an empty name, zero ports, a zero
    /// maximum message size, or a name the provider already uses.
    pub fn add_device(&self, spec: SimDeviceSpec) -> Result<Vec<u32>> {
        self.net.lock().add_device(self.id, spec)
    }

    /// The network the provider lives on.
    pub const fn network(&self) -> &SimNetwork {
        &self.net
    }
}

impl Provider for SimProvider {
    type Context = SimContext;

    fn name(&self) -> &'static str {
        PROVIDER_NAME
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let state = self.net.lock();
        Ok(state
            .devices
            .iter()
            .filter(|d| d.provider == self.id)
            .map(|d| device_info(&d.spec))
            .collect())
    }

    fn open(&self, device: &str) -> Result<SimContext> {
        let (index, spec, port_ids) = {
            let state = self.net.lock();
            let (index, record) = state
                .devices
                .iter()
                .enumerate()
                .find(|(_, d)| d.provider == self.id && d.spec.name == device)
                .ok_or_else(|| FabricError::NoSuchDevice {
                    provider: PROVIDER_NAME,
                    name: device.to_owned(),
                })?;
            (index, record.spec.clone(), record.port_ids())
        };
        Ok(SimContext::new(
            self.net.clone(),
            index,
            device_info(&spec),
            &spec,
            port_ids,
        ))
    }
}

fn device_info(spec: &SimDeviceSpec) -> DeviceInfo {
    DeviceInfo {
        name: spec.name.clone(),
        provider: PROVIDER_NAME,
        port_count: spec.ports,
        attr: DEVICE_ATTR,
        sends_read_at_post: !spec.late_send_reads,
    }
}

/// The port id inside a simulated address, or an error naming the address.
pub(crate) fn sim_port(addr: NodeAddr) -> Result<u32> {
    match addr {
        NodeAddr::Sim(port) => Ok(port),
        other => Err(FabricError::InvalidArgument {
            what: "address handle destination",
            detail: format!("{other} is not an address of the {PROVIDER_NAME} provider"),
        }),
    }
}
