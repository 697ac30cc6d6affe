//! The vocabulary of the verbs model: handles, addresses, attributes, work
//! requests and work completions.

use core::fmt;
use core::ops::BitOr;
use std::net::IpAddr;

use crate::table::Handle;

/// Bytes at the start of every receive buffer that belong to the Global Route
/// Header, as on an InfiniBand UD queue pair. The payload of a receive always
/// starts at this offset, and [`WorkCompletion::byte_len`] counts it. Providers
/// that have no real GRH leave these bytes untouched.
pub const GRH_LEN: usize = 40;

macro_rules! handle_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub(crate) Handle);
    };
}

handle_type!(
    /// A protection domain.
    PdHandle
);
handle_type!(
    /// A completion queue.
    CqHandle
);
handle_type!(
    /// A UD queue pair.
    QpHandle
);
handle_type!(
    /// An address handle: the route to one remote port.
    AhHandle
);
handle_type!(
    /// A memory registration.
    MrHandle
);

/// A local key: names a memory registration in scatter/gather entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LKey(pub u32);

/// Where a port lives on the fabric: the part of an address that an address
/// handle is built from. It plays the role of the LID/GID of InfiniBand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeAddr {
    /// An IP address (the `udp` provider).
    Ip(IpAddr),
    /// A port of the simulated fabric, numbered like a LID.
    Sim(u32),
    /// An InfiniBand port.
    Ib {
        /// Local identifier of the port.
        lid: u16,
        /// Global identifier (used when routing across subnets).
        gid: [u8; 16],
    },
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(ip) => write!(f, "{ip}"),
            Self::Sim(port) => write!(f, "sim:{port}"),
            Self::Ib { lid, .. } => write!(f, "lid:{lid}"),
        }
    }
}

/// The full address of a UD queue pair: where its port is, and its number.
/// For the `udp` provider this is the socket address (IP, UDP port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpAddr {
    /// The port's address.
    pub node: NodeAddr,
    /// The queue pair number.
    pub qpn: u32,
}

impl fmt::Display for QpAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.node {
            NodeAddr::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.qpn),
            node => write!(f, "{node}:{}", self.qpn),
        }
    }
}

/// Device limits, as `ibv_query_device` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Maximum number of queue pairs.
    pub max_qp: u32,
    /// Maximum work requests outstanding on one queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per send work request.
    pub max_sge: u32,
    /// Maximum number of completion queues.
    pub max_cq: u32,
    /// Maximum entries of one completion queue.
    pub max_cqe: u32,
    /// Maximum number of memory registrations.
    pub max_mr: u32,
    /// Maximum number of address handles.
    pub max_ah: u32,
    /// Maximum bytes of inline data a queue pair may be granted.
    pub max_inline_data: u32,
}

/// A device that a provider can open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name, e.g. `lo` for the `udp` provider's loopback device.
    pub name: String,
    /// The provider that owns the device.
    pub provider: &'static str,
    /// Number of ports, numbered from 1 as in verbs.
    pub port_count: u8,
    /// The device's limits.
    pub attr: DeviceAttr,
    /// Whether `post_send` reads a send's bytes before it returns, so that
    /// they may be written again at once: the `udp` provider copies them
    /// into the kernel, the simulator into its network. An RDMA adapter
    /// reads them later, at any time until the send's completion: until
    /// then, nothing may write them, not even to send them again.
    pub sends_read_at_post: bool,
}

/// State of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// The link is down; no module is built on it.
    Down,
    /// The port can carry traffic.
    Active,
}

/// Port attributes, as `ibv_query_port` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Port number (from 1).
    pub port_num: u8,
    /// Link state.
    pub state: PortState,
    /// The port's own address, which peers build address handles from.
    pub addr: NodeAddr,
    /// Largest payload of one datagram, excluding the GRH. A send larger than
    /// this is rejected when posted.
    pub max_msg_size: usize,
    /// Largest payload of a datagram that leaves as one packet: less than
    /// `max_msg_size` on a port that cuts longer datagrams into pieces
    /// (the `udp` provider's `segment`), equal elsewhere. A peer whose
    /// packets are smaller than this port's cannot take its pieces.
    pub packet_size: usize,
    /// The network the port is attached to: ports with equal ids can reach
    /// each other. The BTL pairs a local module with the peer address on its
    /// own network, never by position.
    pub network: u64,
    /// The partition key table; a queue pair selects an entry by index.
    pub pkeys: Vec<u16>,
    /// A name for the link layer, e.g. `udp/ipv4`.
    pub link_layer: &'static str,
}

/// Capacities of a queue pair, requested at creation and granted by the
/// provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send work requests that may be outstanding.
    pub max_send_wr: u32,
    /// Receive work requests that may be posted.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Bytes a send may carry inline.
    pub max_inline_data: u32,
}

/// Arguments of [`Context::create_qp`](crate::Context::create_qp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Completion queue for send completions.
    pub send_cq: CqHandle,
    /// Completion queue for receive completions.
    pub recv_cq: CqHandle,
    /// Requested capacities.
    pub cap: QpCap,
}

/// A created queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// The handle to post work on.
    pub handle: QpHandle,
    /// The queue pair number peers address.
    pub qp_num: u32,
    /// The capacities actually granted.
    pub cap: QpCap,
}

/// States of a UD queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created: nothing can be posted.
    Reset,
    /// Receives may be posted; nothing is received yet.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send (and receive).
    Rts,
}

/// A state transition of [`Context::modify_qp`](crate::Context::modify_qp),
/// carrying the attributes verbs requires at each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpTransition {
    /// RESET → INIT.
    Init {
        /// Index into the port's partition key table.
        pkey_index: u16,
        /// The queue key incoming datagrams must carry.
        qkey: u32,
        /// The port (from 1) the queue pair is bound to.
        port: u8,
    },
    /// INIT → RTR.
    Rtr,
    /// RTR → RTS.
    Rts {
        /// Initial send packet sequence number (meaningless on UD; kept for
        /// fidelity with the verbs call).
        sq_psn: u32,
    },
}

/// Arguments of [`Context::create_ah`](crate::Context::create_ah).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// The remote port.
    pub dest: NodeAddr,
    /// Service level.
    pub service_level: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// The local port to send from.
    pub port: u8,
}

/// A memory registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr {
    /// Handle for deregistration and buffer access.
    pub handle: MrHandle,
    /// The key scatter/gather entries name.
    pub lkey: LKey,
    /// Length of the registered range in bytes.
    pub len: usize,
}

/// A range of provider-owned registered memory (see
/// [`Context::reg_mr`](crate::Context::reg_mr)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// The registration.
    pub lkey: LKey,
    /// Offset of the range inside the registration.
    pub offset: usize,
    /// Length of the range.
    pub len: usize,
}

/// One gather entry of a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather<'a> {
    /// Bytes in provider-owned registered memory.
    Registered(Sge),
    /// Bytes in caller memory registered with
    /// [`Context::reg_user_mr`](crate::Context::reg_user_mr). The slice must
    /// lie inside the registration named by `lkey`.
    User {
        /// The registration covering `data`.
        lkey: LKey,
        /// The bytes to send.
        data: &'a [u8],
    },
}

impl Gather<'_> {
    /// Number of bytes this entry contributes.
    pub const fn len(&self) -> usize {
        match self {
            Self::Registered(sge) => sge.len,
            Self::User { data, .. } => data.len(),
        }
    }

    /// `true` if the entry contributes no bytes.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Flags of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(u8);

impl SendFlags {
    /// No flags: the send completes silently.
    pub const NONE: Self = Self(0);
    /// Generate a completion when the send is done.
    pub const SIGNALED: Self = Self(1);
    /// Copy the data into the work request; lkeys are not checked, and the
    /// length must not exceed the queue pair's inline limit.
    pub const INLINE: Self = Self(2);
    /// Ask the receiver to raise a completion event.
    pub const SOLICITED: Self = Self(4);

    /// `true` if every flag of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for SendFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// A UD send work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The bytes of the datagram, gathered in order.
    pub sg_list: &'a [Gather<'a>],
    /// The route to the remote port.
    pub ah: AhHandle,
    /// The remote queue pair number.
    pub remote_qpn: u32,
    /// The queue key to present; a key with the top bit set means "use the
    /// sending queue pair's own key", as in verbs.
    pub remote_qkey: u32,
    /// Immediate data, delivered in the receive completion.
    pub imm: Option<u32>,
    /// Send flags.
    pub flags: SendFlags,
}

impl SendWr<'_> {
    /// Total payload length of the request.
    pub fn len(&self) -> usize {
        self.sg_list.iter().map(Gather::len).sum()
    }

    /// `true` if the request carries no payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A receive work request: one buffer in provider-owned registered memory.
/// The first [`GRH_LEN`] bytes of the buffer are reserved for the GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The buffer.
    pub sge: Sge,
}

/// What kind of work a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A send.
    Send,
    /// A receive.
    Recv,
}

/// Status of a work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// The work completed.
    Success,
    /// A received datagram was larger than the posted buffer. The buffer is
    /// consumed and holds no valid data.
    LocalLengthError,
    /// The work request named memory it may not use.
    LocalProtectionError,
    /// The work request was flushed when its queue pair was destroyed or
    /// reset.
    WrFlushError,
    /// The provider failed in a way that has no better description.
    GeneralError,
}

/// A work completion, as `ibv_poll_cq` fills it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Send or receive.
    pub opcode: WcOpcode,
    /// For a receive: [`GRH_LEN`] plus the payload length.
    pub byte_len: u32,
    /// The local queue pair number.
    pub qp_num: u32,
    /// For a receive: the sender's queue pair.
    pub src: Option<QpAddr>,
    /// Immediate data of a send-with-immediate.
    pub imm: Option<u32>,
}

impl WorkCompletion {
    /// The payload length of a receive (excluding the GRH).
    pub const fn payload_len(&self) -> usize {
        (self.byte_len as usize).saturating_sub(GRH_LEN)
    }

    /// A zeroed completion, for sizing output arrays.
    pub const EMPTY: Self = Self {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        qp_num: 0,
        src: None,
        imm: None,
    };
}

/// Datagram counters of a provider context. Every datagram a provider
/// discards is counted in exactly one `rx_*`/`tx_*_drops` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FabricStats {
    /// Datagrams handed to the fabric.
    pub tx_datagrams: u64,
    /// Payload bytes handed to the fabric.
    pub tx_bytes: u64,
    /// Sends that coalesced several datagrams with UDP GSO.
    pub tx_gso_trains: u64,
    /// Reads that returned a train of several datagrams with UDP GRO.
    pub rx_gro_trains: u64,
    /// Datagrams longer than the path's MTU, sent in pieces (`udp`
    /// provider, [`udbtl_wire::segment`]).
    pub tx_segmented: u64,
    /// Datagrams in pieces that a read put straight into their posted
    /// buffer (`udp` provider, one GRO train each).
    pub rx_in_place: u64,
    /// Datagrams the kernel refused (ENOBUFS, EAGAIN, EPERM...); to the
    /// peer they look lost.
    pub tx_kernel_drops: u64,
    /// Datagrams delivered into posted receive buffers.
    pub rx_datagrams: u64,
    /// Payload bytes delivered.
    pub rx_bytes: u64,
    /// Dropped: no receive buffer was posted.
    pub rx_no_buffer: u64,
    /// Dropped: the queue key did not match.
    pub rx_bad_qkey: u64,
    /// Dropped: the partition key did not match.
    pub rx_bad_pkey: u64,
    /// Dropped: too short, or an encapsulation header that did not parse.
    pub rx_malformed: u64,
    /// Consumed a receive buffer too small for the datagram (completed with
    /// [`WcStatus::LocalLengthError`]).
    pub rx_too_long: u64,
    /// Dropped: arrived at a queue pair not yet ready to receive.
    pub rx_not_ready: u64,
    /// Dropped: datagrams sent in pieces of which one never arrived (or
    /// came out of order), counted once per datagram.
    pub rx_incomplete: u64,
    /// Dropped by the kernel before the fabric saw them, because the
    /// socket's receive buffer was full (UDP: the sockets' drop counters,
    /// read when the stats are; 0 where the kernel does not say).
    pub rx_kernel_drops: u64,
}

impl FabricStats {
    /// Sum of every receive-side drop.
    pub const fn rx_dropped(&self) -> u64 {
        self.rx_kernel_drops
            + self.rx_no_buffer
            + self.rx_bad_qkey
            + self.rx_bad_pkey
            + self.rx_malformed
            + self.rx_too_long
            + self.rx_not_ready
            + self.rx_incomplete
    }
}

/// Live resources of a context; a leak check compares it with zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceCounts {
    /// Protection domains.
    pub pds: usize,
    /// Memory registrations.
    pub mrs: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Address handles.
    pub ahs: usize,
}

impl ResourceCounts {
    /// `true` when nothing is allocated.
    pub const fn is_empty(&self) -> bool {
        self.pds == 0 && self.mrs == 0 && self.cqs == 0 && self.qps == 0 && self.ahs == 0
    }
}
