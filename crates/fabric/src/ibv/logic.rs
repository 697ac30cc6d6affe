//! The device-free half of the `verbs` provider: plain functions over plain
//! values, compiled with or without the `verbs` feature and unit-tested on
//! machines that have no RDMA device.
//!
//! * [`Gid`]: parsing and formatting of 128-bit global identifiers.
//! * [`Mtu`] and [`LinkLayer`]: the verbs enums, with their numeric values.
//! * [`AhSpec::build`] and [`select_gid_index`]: how an address handle is
//!   routed (LID for InfiniBand, GRH for RoCE).
//! * [`errno_error`] and [`post_errno_error`]: errno to [`FabricError`].
//! * [`RecvLayout`] and [`SlotPool`]: where the device writes a receive,
//!   GRH included, and which staging slots are free.

use core::fmt;
use core::str::FromStr;
use std::io;
use std::net::Ipv6Addr;

use crate::FabricError;
use crate::types::{GRH_LEN, WcOpcode, WcStatus};

/// A 128-bit InfiniBand global identifier (GID), in network byte order: the
/// subnet prefix in the first 8 bytes, the interface id in the last 8. On
/// RoCE the GID is derived from the port's IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID: an empty slot of a GID table.
    pub const ZERO: Self = Self([0; 16]);

    /// The raw bytes, network order.
    pub const fn raw(&self) -> [u8; 16] {
        self.0
    }

    /// The subnet prefix (first 8 bytes), as a number.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.half(0))
    }

    /// The interface id (last 8 bytes, the port GUID on InfiniBand).
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.half(8))
    }

    fn half(&self, at: usize) -> [u8; 8] {
        let mut out = [0; 8];
        out.copy_from_slice(&self.0[at..at + 8]);
        out
    }

    /// `true` for an empty table slot.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// `true` for the link-local prefix `fe80::/64`, the default subnet
    /// prefix of an InfiniBand subnet and of RoCE v1 GIDs.
    pub fn is_link_local(&self) -> bool {
        self.subnet_prefix() == 0xfe80_0000_0000_0000
    }

    /// `true` for an IPv4-mapped GID (`::ffff:a.b.c.d`): the GID of a RoCE
    /// v2 port's IPv4 address, routable across IP subnets.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10] == 0xff && self.0[11] == 0xff
    }
}

impl fmt::Display for Gid {
    /// IPv6 text, as `ibv_devinfo -v` shows GIDs: `fe80::202:c9ff:fe00:1234`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ipv4_mapped() {
            // `::ffff:10.0.0.1` would hide that this is a GID; keep the
            // hexadecimal groups.
            let g = |i: usize| u16::from_be_bytes([self.0[i], self.0[i + 1]]);
            return write!(f, "::ffff:{:x}:{:x}", g(12), g(14));
        }
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

/// A GID did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GidParseError {
    /// Neither IPv6 text nor 32 hexadecimal digits.
    #[error("{text:?} is not a GID (IPv6 text such as fe80::202:c9ff:fe00:1234, or 32 hex digits)")]
    Syntax {
        /// The text given.
        text: String,
    },
}

impl FromStr for Gid {
    type Err = GidParseError;

    /// Accepts IPv6 text (`fe80::0202:c9ff:fe00:1234`, groups of up to four
    /// digits, `::` compression), or the 16 raw bytes as 32 hexadecimal
    /// digits, optionally `0x`-prefixed.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if let Ok(ip) = trimmed.parse::<Ipv6Addr>() {
            return Ok(Self(ip.octets()));
        }
        let hex = trimmed.strip_prefix("0x").unwrap_or(trimmed);
        let syntax = || GidParseError::Syntax {
            text: text.to_owned(),
        };
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(syntax());
        }
        let mut raw = [0u8; 16];
        for (i, byte) in raw.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| syntax())?;
        }
        Ok(Self(raw))
    }
}

impl From<[u8; 16]> for Gid {
    fn from(raw: [u8; 16]) -> Self {
        Self(raw)
    }
}

/// A path MTU, as verbs encodes it (`enum ibv_mtu`, `IBV_MTU_256 = 1` to
/// `IBV_MTU_4096 = 5`). A UD datagram's payload (GRH excluded) is at most
/// the port's active MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Self; 5] = [
        Self::Mtu256,
        Self::Mtu512,
        Self::Mtu1024,
        Self::Mtu2048,
        Self::Mtu4096,
    ];

    /// From the verbs value; `None` outside 1..=5.
    pub const fn from_ibv(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::Mtu256),
            2 => Some(Self::Mtu512),
            3 => Some(Self::Mtu1024),
            4 => Some(Self::Mtu2048),
            5 => Some(Self::Mtu4096),
            _ => None,
        }
    }

    /// The verbs value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// The MTU in bytes.
    pub const fn bytes(self) -> usize {
        128 << (self as u32)
    }

    /// The MTU of exactly `bytes` bytes, if there is one.
    pub fn from_bytes(bytes: usize) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.bytes() == bytes)
    }

    /// The largest MTU of at most `bytes` bytes, if any.
    pub fn at_most(bytes: usize) -> Option<Self> {
        Self::ALL.into_iter().rev().find(|m| m.bytes() <= bytes)
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// The link layer of a port (`IBV_LINK_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: address handles are routed by LID. Verbs reports it as
    /// `IBV_LINK_LAYER_INFINIBAND` (1) or, on old drivers,
    /// `IBV_LINK_LAYER_UNSPECIFIED` (0).
    InfiniBand,
    /// Ethernet (RoCE): every address handle carries a GRH routed by GID.
    Ethernet,
}

impl LinkLayer {
    /// From the verbs value; `None` for a value verbs does not define.
    pub const fn from_ibv(value: u8) -> Option<Self> {
        match value {
            0 | 1 => Some(Self::InfiniBand),
            2 => Some(Self::Ethernet),
            _ => None,
        }
    }

    /// The name [`PortAttr::link_layer`](crate::PortAttr::link_layer)
    /// carries.
    pub const fn name(self) -> &'static str {
        match self {
            Self::InfiniBand => "ib",
            Self::Ethernet => "roce",
        }
    }
}

/// The local side of an address handle: what the sending port is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPort {
    /// The port number (from 1).
    pub port: u8,
    /// Its link layer.
    pub link_layer: LinkLayer,
    /// The GID the port sends from (at `gid_index`).
    pub gid: Gid,
    /// The index of that GID in the port's table.
    pub gid_index: u8,
}

/// Hop limit of a GRH the provider builds: enough for any routed fabric.
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// The attributes of `ibv_create_ah`, as the provider fills them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhSpec {
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Local port.
    pub port_num: u8,
    /// The GRH, when the route needs one: `(dgid, sgid_index, hop_limit)`.
    pub grh: Option<GrhSpec>,
}

/// The global route of an address handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrhSpec {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of the source GID in the local port's table.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
}

impl AhSpec {
    /// Builds the route from `local` to a remote port `(dlid, dgid)`.
    ///
    /// * Ethernet (RoCE): always global, routed by `dgid` from
    ///   `local.gid_index`; the LID is meaningless and set to 0.
    /// * InfiniBand: routed by `dlid`; a GRH is added only when the
    ///   destination is on another subnet (its GID's subnet prefix differs
    ///   from the local one), as a router needs it.
    ///
    /// # Errors
    /// [`FabricError::InvalidArgument`] for a RoCE destination without a
    /// GID, or an InfiniBand destination with LID 0 on the local subnet.
    pub fn build(
        local: &LocalPort,
        dlid: u16,
        dgid: Gid,
        service_level: u8,
        src_path_bits: u8,
    ) -> Result<Self, FabricError> {
        let grh = GrhSpec {
            dgid,
            sgid_index: local.gid_index,
            hop_limit: DEFAULT_HOP_LIMIT,
        };
        let (dlid, grh) = match local.link_layer {
            LinkLayer::Ethernet => {
                if dgid.is_zero() {
                    return Err(FabricError::InvalidArgument {
                        what: "address handle",
                        detail: "a RoCE destination needs a GID".into(),
                    });
                }
                (0, Some(grh))
            }
            LinkLayer::InfiniBand => {
                let remote_subnet = !dgid.is_zero()
                    && !local.gid.is_zero()
                    && dgid.subnet_prefix() != local.gid.subnet_prefix();
                if dlid == 0 && !remote_subnet {
                    return Err(FabricError::InvalidArgument {
                        what: "address handle",
                        detail: "an InfiniBand destination needs a LID".into(),
                    });
                }
                (dlid, remote_subnet.then_some(grh))
            }
        };
        Ok(Self {
            dlid,
            sl: service_level & 0xf,
            src_path_bits: src_path_bits & 0x7f,
            port_num: local.port,
            grh,
        })
    }
}

/// Chooses the GID index a port sends from.
///
/// An explicit `wanted` index must name a non-empty entry of `table`.
/// Otherwise InfiniBand uses index 0 (the port GID), and Ethernet prefers
/// the first IPv4-mapped GID (RoCE v2 over IPv4, routable), then the first
/// non-link-local one, then the first non-empty one.
///
/// # Errors
/// [`FabricError::InvalidArgument`] when `wanted` is out of the table or
/// names an empty entry, or when the table has no usable GID.
pub fn select_gid_index(
    table: &[Gid],
    link_layer: LinkLayer,
    wanted: Option<u8>,
) -> Result<u8, FabricError> {
    let usable = |(i, gid): (usize, &Gid)| (!gid.is_zero()).then_some(i);
    let found = if let Some(index) = wanted {
        match table.get(usize::from(index)) {
            Some(gid) if !gid.is_zero() => Some(usize::from(index)),
            _ => {
                return Err(FabricError::InvalidArgument {
                    what: "GID index",
                    detail: format!(
                        "{index} names no GID (the port's table has {} entries)",
                        table.len()
                    ),
                });
            }
        }
    } else {
        match link_layer {
            LinkLayer::InfiniBand => table.first().and_then(|g| usable((0, g))),
            LinkLayer::Ethernet => table
                .iter()
                .enumerate()
                .find(|(_, g)| g.is_ipv4_mapped())
                .and_then(usable)
                .or_else(|| {
                    table
                        .iter()
                        .enumerate()
                        .find(|(_, g)| !g.is_zero() && !g.is_link_local())
                        .and_then(usable)
                })
                .or_else(|| table.iter().enumerate().find_map(usable)),
        }
    };
    found
        .and_then(|i| u8::try_from(i).ok())
        .ok_or_else(|| FabricError::InvalidArgument {
            what: "GID index",
            detail: "the port's GID table has no usable entry".into(),
        })
}

/// The network id of a port
/// ([`PortAttr::network`](crate::PortAttr::network)): ports that can reach
/// each other must agree on it on every host.
///
/// On InfiniBand it is the subnet prefix of the port GID: one per subnet,
/// and every port of a subnet shares it. On Ethernet, where a GID says
/// nothing of the L2 segment, all RoCE ports are taken as one network;
/// reachability is then the IP fabric's.
pub fn network_id(link_layer: LinkLayer, port_gid: Gid) -> u64 {
    let mut hash = udbtl_wire::hash::Fnv1a::new();
    match link_layer {
        LinkLayer::InfiniBand => {
            hash.write(b"ib");
            hash.write(&port_gid.subnet_prefix().to_be_bytes());
        }
        LinkLayer::Ethernet => hash.write(b"roce"),
    }
    hash.finish()
}

/// What was being done when verbs returned an errno, for [`errno_error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `ibv_open_device`.
    OpenDevice,
    /// `ibv_query_device`, `ibv_query_port`, `ibv_query_gid`, ...
    Query,
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_reg_mr`.
    RegMr,
    /// `ibv_create_cq` or `ibv_resize_cq`.
    CreateCq,
    /// `ibv_create_qp`.
    CreateQp,
    /// `ibv_modify_qp`.
    ModifyQp,
    /// `ibv_create_ah`.
    CreateAh,
    /// `ibv_poll_cq`.
    PollCq,
    /// `ibv_destroy_*`, `ibv_dereg_mr`, `ibv_dealloc_pd`,
    /// `ibv_close_device`.
    Destroy,
}

impl Verb {
    /// The verbs function's name.
    pub const fn operation(self) -> &'static str {
        match self {
            Self::OpenDevice => "ibv_open_device",
            Self::Query => "ibv_query",
            Self::AllocPd => "ibv_alloc_pd",
            Self::RegMr => "ibv_reg_mr",
            Self::CreateCq => "ibv_create_cq",
            Self::CreateQp => "ibv_create_qp",
            Self::ModifyQp => "ibv_modify_qp",
            Self::CreateAh => "ibv_create_ah",
            Self::PollCq => "ibv_poll_cq",
            Self::Destroy => "ibv_destroy",
        }
    }

    /// The resource a creation makes, for [`FabricError::ResourceExhausted`].
    const fn resource(self) -> &'static str {
        match self {
            Self::AllocPd => "protection domains",
            Self::RegMr => "memory registrations",
            Self::CreateCq => "completion queues",
            Self::CreateQp => "queue pairs",
            Self::CreateAh => "address handles",
            _ => "device memory",
        }
    }
}

/// Maps the errno of a failed verb (other than a post) to a
/// [`FabricError`].
///
/// * `ENOMEM`, `ENOSPC`, `EAGAIN` while creating: the device is out of
///   that resource ([`FabricError::ResourceExhausted`], limit 0: verbs does
///   not say which limit was hit).
/// * `EINVAL`, `EOPNOTSUPP`, `ERANGE`: an attribute the device refuses
///   ([`FabricError::InvalidArgument`]).
/// * `ENODEV`, `ENXIO`, `EIO` on an opened device: the device is gone
///   ([`FabricError::DeviceLost`]).
/// * `EBUSY` on destroy: dependants remain ([`FabricError::Busy`]).
/// * Anything else: [`FabricError::Io`] with the OS error.
pub fn errno_error(verb: Verb, errno: i32, device: &str) -> FabricError {
    let creating = matches!(
        verb,
        Verb::AllocPd | Verb::RegMr | Verb::CreateCq | Verb::CreateQp | Verb::CreateAh
    );
    match errno {
        libc::ENOMEM | libc::ENOSPC | libc::EAGAIN if creating => FabricError::ResourceExhausted {
            what: verb.resource(),
            limit: 0,
        },
        libc::EINVAL | libc::EOPNOTSUPP | libc::ERANGE => FabricError::InvalidArgument {
            what: verb.operation(),
            detail: io::Error::from_raw_os_error(errno).to_string(),
        },
        libc::ENODEV | libc::ENXIO | libc::EIO => FabricError::DeviceLost {
            device: device.to_owned(),
            reason: format!(
                "{}: {}",
                verb.operation(),
                io::Error::from_raw_os_error(errno)
            ),
        },
        libc::EBUSY if verb == Verb::Destroy => FabricError::Busy {
            kind: "verbs object",
            users: 1,
            user_kind: "dependent objects",
        },
        _ => FabricError::Io {
            operation: verb.operation(),
            source: io::Error::from_raw_os_error(errno),
        },
    }
}

/// Maps the errno of a refused `ibv_post_send`/`ibv_post_recv`: `ENOMEM`
/// and `EAGAIN` mean the work queue is full
/// ([`FabricError::QueueFull`] with the queue's capacity), `EINVAL` a bad
/// request, anything else as [`errno_error`].
pub fn post_errno_error(
    errno: i32,
    queue: &'static str,
    capacity: usize,
    device: &str,
) -> FabricError {
    match errno {
        libc::ENOMEM | libc::EAGAIN => FabricError::QueueFull { queue, capacity },
        libc::EINVAL => FabricError::InvalidArgument {
            what: "work request",
            detail: format!("{queue}: {}", io::Error::from_raw_os_error(errno)),
        },
        _ => errno_error(Verb::Query, errno, device),
    }
}

/// `IBV_WC_RECV`: receive opcodes have this bit set.
pub const WC_RECV_BIT: u32 = 1 << 7;
/// `IBV_WC_GRH`: the receive buffer starts with a valid GRH.
pub const WC_FLAG_GRH: u32 = 1 << 0;
/// `IBV_WC_WITH_IMM`: the completion carries immediate data.
pub const WC_FLAG_WITH_IMM: u32 = 1 << 1;

/// A completion status (`enum ibv_wc_status`) as a [`WcStatus`].
pub const fn wc_status(status: u32) -> WcStatus {
    match status {
        0 => WcStatus::Success,
        1 => WcStatus::LocalLengthError,
        4 => WcStatus::LocalProtectionError,
        5 => WcStatus::WrFlushError,
        _ => WcStatus::GeneralError,
    }
}

/// A completion opcode (`enum ibv_wc_opcode`) as a [`WcOpcode`].
pub const fn wc_opcode(opcode: u32) -> WcOpcode {
    if opcode & WC_RECV_BIT != 0 {
        WcOpcode::Recv
    } else {
        WcOpcode::Send
    }
}

/// The source GID of a received GRH: bytes 8..24 of the 40-byte header
/// the device writes in front of the payload.
pub fn grh_source_gid(grh: &[u8; GRH_LEN]) -> Gid {
    let mut raw = [0; 16];
    raw.copy_from_slice(&grh[8..24]);
    Gid(raw)
}

/// Where the provider stages receives: a registered region of `slots`
/// equal slots, each `GRH_LEN + max_payload` bytes. The device writes a
/// datagram's GRH at the start of its slot and the payload right after, so
/// a completion's `byte_len` is `GRH_LEN + payload`: the same layout the
/// fabric contract gives every receive buffer ([`GRH_LEN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvLayout {
    /// Number of slots.
    pub slots: usize,
    /// Bytes per slot.
    pub slot_len: usize,
}

impl RecvLayout {
    /// The layout for `slots` receives of up to `max_payload` bytes.
    pub const fn new(slots: usize, max_payload: usize) -> Self {
        Self {
            slots,
            slot_len: GRH_LEN + max_payload,
        }
    }

    /// The region's length in bytes.
    pub const fn region_len(&self) -> usize {
        self.slots * self.slot_len
    }

    /// Byte offset of slot `slot` in the region.
    pub const fn offset(&self, slot: usize) -> usize {
        slot * self.slot_len
    }

    /// Length of the scatter entry to post for a caller buffer of
    /// `buffer_len` bytes: the caller's length, capped at the slot, so the
    /// device itself reports a datagram that does not fit the caller's
    /// buffer (`IBV_WC_LOC_LEN_ERR`) exactly as it would in place.
    pub fn post_len(&self, buffer_len: usize) -> u32 {
        u32::try_from(buffer_len.min(self.slot_len)).unwrap_or(u32::MAX)
    }

    /// The range of slot `slot` a completion of `byte_len` bytes filled
    /// (GRH included), clamped to the slot.
    pub fn filled(&self, slot: usize, byte_len: u32) -> core::ops::Range<usize> {
        let start = self.offset(slot);
        start..start + (byte_len as usize).min(self.slot_len)
    }
}

/// A free list of staging slots, handed out by index: a slot belongs to
/// exactly one posted work request until its completion is polled.
#[derive(Debug, Clone)]
pub struct SlotPool {
    free: Vec<u32>,
    busy: Vec<bool>,
}

impl SlotPool {
    /// A pool of `count` free slots.
    pub fn new(count: u32) -> Self {
        Self {
            free: (0..count).rev().collect(),
            busy: vec![false; count as usize],
        }
    }

    /// Takes a free slot, or `None` when all are posted.
    pub fn take(&mut self) -> Option<u32> {
        let slot = self.free.pop()?;
        if let Some(busy) = self.busy.get_mut(slot as usize) {
            *busy = true;
        }
        Some(slot)
    }

    /// Returns a slot; `false` (and no change) if it was not taken.
    pub fn give(&mut self, slot: u32) -> bool {
        match self.busy.get_mut(slot as usize) {
            Some(busy) if *busy => {
                *busy = false;
                self.free.push(slot);
                true
            }
            _ => false,
        }
    }

    /// Slots free.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Slots in the pool.
    pub fn capacity(&self) -> usize {
        self.busy.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(text: &str) -> Gid {
        text.parse().expect("gid")
    }

    #[test]
    fn gids_parse_from_ipv6_text_and_raw_hex() {
        let g = gid("fe80::0202:c9ff:fe00:1234");
        assert_eq!(
            g.raw(),
            [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0x00, 0x12, 0x34
            ]
        );
        assert_eq!(g.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(g.interface_id(), 0x0202_c9ff_fe00_1234);
        assert!(g.is_link_local());
        assert_eq!(
            gid("fe80000000000000 0202c9fffe001234"
                .replace(' ', "")
                .as_str()),
            g
        );
        assert_eq!(gid("0xfe800000000000000202c9fffe001234"), g);
        assert_eq!(gid("fe80:0000:0000:0000:0202:c9ff:fe00:1234"), g);
        for bad in [
            "",
            "fe80::1::2",
            "fe80",
            "zz800000000000000202c9fffe001234",
            "fe800000",
        ] {
            assert!(bad.parse::<Gid>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn gids_format_as_ipv6_and_round_trip() {
        let g = gid("fe80::0202:c9ff:fe00:1234");
        assert_eq!(g.to_string(), "fe80::202:c9ff:fe00:1234");
        let mapped = gid("::ffff:10.0.0.1");
        assert!(mapped.is_ipv4_mapped());
        assert_eq!(mapped.to_string(), "::ffff:a00:1");
        assert_eq!(Gid::ZERO.to_string(), "::");
        for g in [g, mapped, Gid::ZERO, Gid([0xab; 16])] {
            assert_eq!(gid(&g.to_string()), g);
        }
    }

    #[test]
    fn mtu_enum_converts_both_ways() {
        assert_eq!(Mtu::from_ibv(1), Some(Mtu::Mtu256));
        assert_eq!(Mtu::from_ibv(5), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::from_ibv(0), None);
        assert_eq!(Mtu::from_ibv(6), None);
        let bytes: Vec<usize> = Mtu::ALL.iter().map(|m| m.bytes()).collect();
        assert_eq!(bytes, [256, 512, 1024, 2048, 4096]);
        for m in Mtu::ALL {
            assert_eq!(Mtu::from_ibv(m.to_ibv()), Some(m));
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::at_most(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::at_most(100), None);
        assert_eq!(Mtu::Mtu2048.to_string(), "2048");
    }

    #[test]
    fn link_layers_map_from_verbs_values() {
        assert_eq!(LinkLayer::from_ibv(0), Some(LinkLayer::InfiniBand));
        assert_eq!(LinkLayer::from_ibv(1), Some(LinkLayer::InfiniBand));
        assert_eq!(LinkLayer::from_ibv(2), Some(LinkLayer::Ethernet));
        assert_eq!(LinkLayer::from_ibv(3), None);
    }

    fn ib_port() -> LocalPort {
        LocalPort {
            port: 1,
            link_layer: LinkLayer::InfiniBand,
            gid: gid("fe80::1"),
            gid_index: 0,
        }
    }

    #[test]
    fn infiniband_address_handles_route_by_lid() {
        let ah = AhSpec::build(&ib_port(), 7, gid("fe80::2"), 3, 1).expect("ah");
        assert_eq!(
            ah,
            AhSpec {
                dlid: 7,
                sl: 3,
                src_path_bits: 1,
                port_num: 1,
                grh: None
            }
        );
        // No GID known: still LID-routed.
        assert_eq!(
            AhSpec::build(&ib_port(), 7, Gid::ZERO, 0, 0)
                .expect("ah")
                .grh,
            None
        );
        // Out-of-range service level and path bits are masked to their fields.
        let ah = AhSpec::build(&ib_port(), 7, Gid::ZERO, 0x1f, 0xff).expect("ah");
        assert_eq!((ah.sl, ah.src_path_bits), (0xf, 0x7f));
        assert!(AhSpec::build(&ib_port(), 0, gid("fe80::2"), 0, 0).is_err());
    }

    #[test]
    fn infiniband_address_handles_to_another_subnet_carry_a_grh() {
        let remote = gid("fec0:0:0:1::2");
        let ah = AhSpec::build(&ib_port(), 9, remote, 0, 0).expect("ah");
        assert_eq!(
            ah.grh,
            Some(GrhSpec {
                dgid: remote,
                sgid_index: 0,
                hop_limit: DEFAULT_HOP_LIMIT
            })
        );
        assert_eq!(ah.dlid, 9);
    }

    #[test]
    fn roce_address_handles_are_global_from_the_chosen_gid_index() {
        let local = LocalPort {
            port: 2,
            link_layer: LinkLayer::Ethernet,
            gid: gid("::ffff:10.0.0.1"),
            gid_index: 3,
        };
        let dest = gid("::ffff:10.0.0.2");
        let ah = AhSpec::build(&local, 0, dest, 0, 0).expect("ah");
        assert_eq!(ah.dlid, 0);
        assert_eq!(ah.port_num, 2);
        assert_eq!(
            ah.grh,
            Some(GrhSpec {
                dgid: dest,
                sgid_index: 3,
                hop_limit: DEFAULT_HOP_LIMIT
            })
        );
        assert!(AhSpec::build(&local, 5, Gid::ZERO, 0, 0).is_err());
    }

    #[test]
    fn gid_index_selection() {
        let table = [
            gid("fe80::1"),
            gid("fe80::1"),
            Gid::ZERO,
            gid("::ffff:10.0.0.1"),
            gid("2001:db8::1"),
        ];
        assert_eq!(
            select_gid_index(&table, LinkLayer::InfiniBand, None).ok(),
            Some(0)
        );
        assert_eq!(
            select_gid_index(&table, LinkLayer::Ethernet, None).ok(),
            Some(3)
        );
        assert_eq!(
            select_gid_index(&table, LinkLayer::Ethernet, Some(1)).ok(),
            Some(1)
        );
        assert!(select_gid_index(&table, LinkLayer::Ethernet, Some(2)).is_err());
        assert!(select_gid_index(&table, LinkLayer::Ethernet, Some(9)).is_err());
        let no_v4 = [gid("fe80::1"), gid("2001:db8::1")];
        assert_eq!(
            select_gid_index(&no_v4, LinkLayer::Ethernet, None).ok(),
            Some(1)
        );
        let link_local_only = [Gid::ZERO, gid("fe80::1")];
        assert_eq!(
            select_gid_index(&link_local_only, LinkLayer::Ethernet, None).ok(),
            Some(1)
        );
        assert!(select_gid_index(&[Gid::ZERO], LinkLayer::InfiniBand, None).is_err());
        assert!(select_gid_index(&[], LinkLayer::Ethernet, None).is_err());
    }

    #[test]
    fn network_ids_follow_the_subnet_prefix_on_infiniband() {
        let a = network_id(LinkLayer::InfiniBand, gid("fe80::1"));
        assert_eq!(a, network_id(LinkLayer::InfiniBand, gid("fe80::2")));
        assert_ne!(a, network_id(LinkLayer::InfiniBand, gid("fec0::1")));
        assert_ne!(a, network_id(LinkLayer::Ethernet, gid("fe80::1")));
        assert_eq!(
            network_id(LinkLayer::Ethernet, gid("::ffff:10.0.0.1")),
            network_id(LinkLayer::Ethernet, gid("::ffff:10.1.0.1"))
        );
    }

    #[test]
    fn errnos_map_to_fabric_errors() {
        let dev = "mlx5_0";
        assert!(matches!(
            errno_error(Verb::CreateQp, libc::ENOMEM, dev),
            FabricError::ResourceExhausted {
                what: "queue pairs",
                ..
            }
        ));
        assert!(matches!(
            errno_error(Verb::CreateCq, libc::EAGAIN, dev),
            FabricError::ResourceExhausted {
                what: "completion queues",
                ..
            }
        ));
        assert!(matches!(
            errno_error(Verb::ModifyQp, libc::EINVAL, dev),
            FabricError::InvalidArgument {
                what: "ibv_modify_qp",
                ..
            }
        ));
        match errno_error(Verb::Query, libc::ENODEV, dev) {
            FabricError::DeviceLost { device, reason } => {
                assert_eq!(device, dev);
                assert!(reason.starts_with("ibv_query"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            errno_error(Verb::Destroy, libc::EBUSY, dev),
            FabricError::Busy { .. }
        ));
        match errno_error(Verb::Query, libc::EACCES, dev) {
            FabricError::Io { operation, source } => {
                assert_eq!(operation, "ibv_query");
                assert_eq!(source.raw_os_error(), Some(libc::EACCES));
            }
            other => panic!("{other:?}"),
        }
        // ENOMEM outside a creation is a plain OS error.
        assert!(matches!(
            errno_error(Verb::Query, libc::ENOMEM, dev),
            FabricError::Io { .. }
        ));
    }

    #[test]
    fn post_errnos_mean_a_full_queue() {
        for errno in [libc::ENOMEM, libc::EAGAIN] {
            assert!(matches!(
                post_errno_error(errno, "send queue", 64, "d"),
                FabricError::QueueFull {
                    queue: "send queue",
                    capacity: 64
                }
            ));
        }
        assert!(matches!(
            post_errno_error(libc::EINVAL, "receive queue", 8, "d"),
            FabricError::InvalidArgument { .. }
        ));
        assert!(matches!(
            post_errno_error(libc::ENODEV, "receive queue", 8, "d"),
            FabricError::DeviceLost { .. }
        ));
    }

    #[test]
    fn completion_fields_map_from_verbs_values() {
        assert_eq!(wc_status(0), WcStatus::Success);
        assert_eq!(wc_status(1), WcStatus::LocalLengthError);
        assert_eq!(wc_status(4), WcStatus::LocalProtectionError);
        assert_eq!(wc_status(5), WcStatus::WrFlushError);
        assert_eq!(wc_status(12), WcStatus::GeneralError);
        assert_eq!(wc_opcode(0), WcOpcode::Send);
        assert_eq!(wc_opcode(128), WcOpcode::Recv);
        assert_eq!(wc_opcode(129), WcOpcode::Recv);
    }

    #[test]
    fn receive_slots_hold_the_grh_then_the_payload() {
        let layout = RecvLayout::new(4, 4096);
        assert_eq!(layout.slot_len, GRH_LEN + 4096);
        assert_eq!(layout.region_len(), 4 * (40 + 4096));
        assert_eq!(layout.offset(2), 2 * 4136);
        // A caller buffer smaller than a slot is posted at its own length,
        // a larger one at the slot's.
        assert_eq!(layout.post_len(GRH_LEN + 100), 140);
        assert_eq!(layout.post_len(1 << 20), 4136);
        // A completion of GRH + 10 bytes filled the slot's first 50 bytes:
        // GRH at 0..40, payload at 40..50, as GRH_LEN promises.
        assert_eq!(layout.filled(1, 50), 4136..4186);
        assert_eq!(layout.filled(0, u32::MAX), 0..4136);
        let mut grh = [0u8; GRH_LEN];
        grh[8..24].copy_from_slice(&gid("fe80::0202:c9ff:fe00:1234").raw());
        assert_eq!(grh_source_gid(&grh), gid("fe80::202:c9ff:fe00:1234"));
    }

    #[test]
    fn slot_pool_hands_each_slot_to_one_owner() {
        let mut pool = SlotPool::new(3);
        assert_eq!(pool.capacity(), 3);
        let a = pool.take().expect("slot");
        let b = pool.take().expect("slot");
        let c = pool.take().expect("slot");
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(pool.take(), None);
        assert!(pool.give(b));
        assert!(!pool.give(b), "a slot is returned once");
        assert!(!pool.give(7), "an unknown slot is refused");
        assert_eq!(pool.available(), 1);
        assert_eq!(pool.take(), Some(b));
    }
}
