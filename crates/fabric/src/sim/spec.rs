//! What a simulated device is made of: its ports, its largest message, its
//! network, and when it reads what is sent.

use super::DEFAULT_MAX_MSG_SIZE;
#[cfg(doc)]
use super::{SimNetwork, SimProvider};

/// A device to add to a [`SimProvider`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDeviceSpec {
    /// Device name, unique within its provider (e.g. `sim0`).
    pub name: String,
    /// Number of ports (at least 1), numbered from 1.
    pub ports: u8,
    /// Largest payload a port of the device accepts in one send.
    pub max_msg_size: usize,
    /// The network its ports are attached to (see
    /// [`PortAttr::network`](crate::PortAttr::network)); 0 unless a test
    /// builds several.
    pub network: u64,
    /// Whether the device reads a send's bytes only when it sends it, as an
    /// RDMA adapter does, instead of while `post_send` runs: then what is
    /// posted while the network holds sends ([`SimNetwork::hold_sends`])
    /// is read when it lets them go. Off by default.
    pub late_send_reads: bool,
}

impl SimDeviceSpec {
    /// A device with `ports` ports and the default maximum message size of
    /// 4096 bytes.
    pub fn new(name: &str, ports: u8) -> Self {
        Self {
            name: name.to_owned(),
            ports,
            max_msg_size: DEFAULT_MAX_MSG_SIZE,
            network: 0,
            late_send_reads: false,
        }
    }

    /// The same device, reading a send's bytes only when it sends it (see
    /// [`late_send_reads`](Self::late_send_reads)).
    #[must_use]
    pub const fn with_late_send_reads(mut self) -> Self {
        self.late_send_reads = true;
        self
    }

    /// The same device attached to another network.
    #[must_use]
    pub const fn with_network(mut self, network: u64) -> Self {
        self.network = network;
        self
    }

    /// The same device with another maximum message size.
    #[must_use]
    pub const fn with_max_msg_size(mut self, max_msg_size: usize) -> Self {
        self.max_msg_size = max_msg_size;
        self
    }
}
