//! The UD byte transfer layer: Open MPI's `btl_ofud`, finished.
//!
//! A [`Component`] opens the fabric's devices and builds one [`Module`] per
//! active port (up to `max_btls`). A module owns a protection domain, a
//! registration cache, one completion queue of depth `rd_num + sd_num`,
//! [`NUM_QP`] UD queue pairs and a pool of `rd_num` receive buffers posted at
//! once, whatever the number of peers: memory stays flat as jobs grow.
//! [`Transport`] is the component as a job opens it
//! ([`Transport::open`]): on the provider its settings choose (`udp`,
//! `udp` behind the fault injector, or `verbs`), boxed as one type.
//!
//! # The contract
//!
//! * **Addressing.** [`Component::modex`] serializes every module's address
//!   ([`udbtl_wire::modex`]); [`Component::add_procs`] turns peers' blobs into
//!   endpoints, pairing each local module with the peer address on its own
//!   network, and marks the others unreachable.
//! * **Descriptors.** [`Module::alloc`] and [`Module::prepare_src`] hand out
//!   [`Descriptor`]s; the caller fills the segment ([`Module::segment_mut`]),
//!   then [`Module::send`]s it with a [`Tag`]. The BTL owns a descriptor from
//!   `send` until its send callback; with [`DesFlags::BTL_OWNERSHIP`] it also
//!   frees it then. Otherwise the caller frees it ([`Module::free`]).
//! * **Receiving.** [`Module::register`] installs a callback per tag; it
//!   runs inside [`Module::progress`] with the payload, which is valid only
//!   during the call.
//! * **Progress.** [`Component::progress`] polls every module's completion
//!   queue once and returns the number of completions handled.
//!
//! # Reliability
//!
//! By default (`reliable = true`) every datagram carries a reliability
//! extension and the module drives the sans-IO state of
//! [`udbtl_reliability`]: each peer's messages arrive exactly once, in
//! order and intact (checksummed where the fabric does not check), and a
//! send completes when the peer acknowledged it. The BTL owns a descriptor
//! from `send` until then and retransmits from it without copying. A peer
//! that acknowledges nothing for `peer_timeout` is declared lost: its sends
//! fail through the send callback and the error callback names it.
//! [`Module::send_message`] carries messages of any length.
//! `reliable = false` gives back the seed's unreliable behaviour, where a
//! send completion means the datagram left.
//!
//! # Time
//!
//! The BTL never reads a clock of its own: every timer runs on the fabric's
//! clock ([`udbtl_fabric::Context::now`]), so on the simulated fabric
//! retransmission, acknowledgement delay and peer failure all run on
//! virtual time.
//!
//! # Parameters
//!
//! [`params::Params`] holds the seed's parameters, under the seed's names and
//! defaults, overridable by a [`params::BtlConfig`] and by `UDBTL_<NAME>`
//! environment variables.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod component;
pub mod convertor;
mod error;
mod frag;
mod module;
pub mod params;
pub mod rcache;

#[cfg(feature = "verbs")]
pub use component::verbs_config;
pub use component::{
    Component, JobLayout, Transport, TransportError, TransportModule, check_udp_settings,
    udp_config, udp_config_in,
};
pub use convertor::Convertor;
pub use error::{BtlError, SendFailure};
pub use frag::{DesFlags, Descriptor, LentBytes};
pub use module::{
    AddProcs, ErrorCallback, ErrorEvent, HostEvent, Limits, Module, ModuleStats, Polled,
    ReadCallback, ReadEvent, ReadFailure, ReadTarget, Received, RecvCallback, RecvEvent, Region,
    RegionKey, RemoteRange, Segment, SendArgs, SendCallback, SendEvent, SendStatus,
    USER_RESERVE_MAX, recv_buffer_len,
};
pub use params::{BtlConfig, Params};

/// Queue pairs per module. Peers are striped over them (one peer's stream
/// always leaves by the same one, [`sending_qp`]); a constant rather than a
/// parameter, as in the seed.
pub const NUM_QP: usize = 4;

/// Which of a module's [`NUM_QP`] queue pairs sends to the module that
/// receives on queue pair `receiver_qpn`: part of the protocol, since both
/// ends work it out, the sender to pick its queue pair and the receiver to
/// know the one address a peer's datagrams come from. A hash, since queue
/// pair numbers are often allocated in steps of `NUM_QP` (every module's
/// first with the same remainder).
pub const fn sending_qp(receiver_qpn: u32) -> usize {
    const { assert!(NUM_QP.is_power_of_two()) };
    (receiver_qpn.wrapping_mul(0x9e37_79b9) >> (32 - NUM_QP.trailing_zeros())) as usize
}

/// Completions taken from the completion queue per progress call (the seed's
/// `MCA_BTL_UD_NUM_WC`).
pub const NUM_WC: usize = 500;

/// The `order` value meaning "no ordering requested".
pub const NO_ORDER: u8 = 255;

/// An active-message tag: selects the receive callback. The top three bits
/// name the framework that owns the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub u8);

impl Tag {
    /// First tag of the BTLs' own range.
    pub const BTL: Self = Self(0x20);
    /// First tag of the point-to-point messaging layer's range.
    pub const PML: Self = Self(0x40);
    /// First tag of the one-sided layer's range.
    pub const OSC_RDMA: Self = Self(0x60);
    /// First tag of the range left to users.
    pub const USR: Self = Self(0x80);
    /// Reserved for the InfiniBand BTL.
    pub const BTL_IB: Self = Self(0x20);
    /// Reserved for the uDAPL BTL.
    pub const BTL_UDAPL: Self = Self(0x21);

    /// The framework range this tag falls in (its top three bits).
    pub const fn framework(self) -> u8 {
        self.0 & 0xe0
    }
}

/// A peer as one module sees it: an index into the module's endpoint table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(pub(crate) u32);

impl EndpointId {
    /// The raw index.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// The endpoint whose [`raw`](Self::raw) index is `raw`, for callers that
    /// keep handles outside Rust. A module refuses an index it does not
    /// know.
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }
}
