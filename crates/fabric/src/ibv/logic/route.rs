//! How an address handle is routed: [`AhSpec::build`] (LID for
//! InfiniBand, a GRH for RoCE and across subnets), [`select_gid_index`],
//! and [`network_id`], which ports can reach each other.

use super::port::{Gid, LinkLayer};
use crate::FabricError;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(text: &str) -> Gid {
        text.parse().expect("gid")
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
}
