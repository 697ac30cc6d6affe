//! Port identity in the verbs model: [`Gid`] (parsing and formatting of
//! 128-bit global identifiers), and the verbs enums [`Mtu`] and
//! [`LinkLayer`] with their numeric values, and the port state that counts
//! as up.

use core::fmt;
use core::str::FromStr;
use std::net::Ipv6Addr;

/// `IBV_PORT_ACTIVE`: the port state in which a port carries traffic.
pub const IBV_PORT_ACTIVE: u32 = 4;

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
}
