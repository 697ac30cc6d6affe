//! Which of the host's interfaces the `udp` provider offers as devices, and
//! which IP network each is on. Pure functions of the interface list, so
//! every rule is tested without touching the host's network.

use std::net::IpAddr;

use super::sys::Interface;

/// The interfaces offered when the configuration names none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum InterfaceScope {
    /// Loopback only: every process of the job is on this host.
    #[default]
    Loopback,
    /// Every interface but loopback, as Open MPI's tcp BTL: the job spans
    /// hosts, and loopback reaches none of the others.
    Network,
}

/// What [`select`] chooses by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Selection<'a> {
    /// Interfaces to offer, by name or subnet; empty: [`scope`](Self::scope).
    pub(crate) include: &'a [String],
    /// Interfaces never to offer, by name or subnet.
    pub(crate) exclude: &'a [String],
    /// Offer only the interface holding this address.
    pub(crate) bind: Option<IpAddr>,
    /// The interfaces offered when neither `include` nor `bind` chooses.
    pub(crate) scope: InterfaceScope,
}

/// The interfaces of `all` that `selection` offers, in `all`'s order.
pub(crate) fn select(all: Vec<Interface>, selection: Selection<'_>) -> Vec<Interface> {
    let named = |iface: &Interface, list: &[String]| {
        list.iter().any(|wanted| interface_matches(iface, wanted))
    };
    all.into_iter()
        .filter(|iface| {
            if !selection.include.is_empty() {
                named(iface, selection.include)
            } else if let Some(bind) = selection.bind {
                iface.addrs.iter().any(|(ip, _)| *ip == bind)
            } else {
                match selection.scope {
                    InterfaceScope::Loopback => iface.loopback,
                    InterfaceScope::Network => !iface.loopback,
                }
            }
        })
        .filter(|iface| !named(iface, selection.exclude))
        .collect()
}

/// Whether `iface` is the one `wanted` names: by name, or by a subnet
/// (`10.77.0.0/24`) one of its addresses is in. A subnet names the same
/// network on every host even where interface names differ.
pub(crate) fn interface_matches(iface: &Interface, wanted: &str) -> bool {
    let Some((net, prefix)) = wanted.split_once('/') else {
        return iface.name == wanted;
    };
    let (Ok(net), Ok(prefix)) = (net.parse::<IpAddr>(), prefix.parse::<u32>()) else {
        return false;
    };
    iface
        .addrs
        .iter()
        .any(|(ip, _)| same_subnet(*ip, net, prefix))
}

/// Whether `a` and `b` agree on their first `prefix` bits.
fn same_subnet(a: IpAddr, b: IpAddr, prefix: u32) -> bool {
    let masked = |bits: u128, width: u32| {
        if prefix == 0 {
            0
        } else if prefix >= width {
            bits
        } else {
            bits >> (width - prefix)
        }
    };
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            masked(u32::from(a).into(), 32) == masked(u32::from(b).into(), 32)
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => masked(u128::from(a), 128) == masked(u128::from(b), 128),
        _ => false,
    }
}

/// Names the IP network a port is on: the subnet (address masked by its
/// prefix) for a real interface. A loopback network exists once per host,
/// and once per network namespace on a host, so its id also folds in
/// `loopback_identity` ([`loopback_identity`]): two hosts' `127.0.0.1`
/// must never look like the same network.
pub(crate) fn network_id(
    iface: &Interface,
    ip: IpAddr,
    prefix: u8,
    loopback_identity: &[u8],
) -> u64 {
    // A stable hash: every process of a job must compute the same id.
    let mut hash = udbtl_wire::hash::Fnv1a::new();
    match ip {
        IpAddr::V4(v4) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            hash.write(&[4, prefix]);
            hash.write(&(u32::from(v4) & mask).to_be_bytes());
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            hash.write(&[6, prefix]);
            hash.write(&(u128::from(v6) & mask).to_be_bytes());
        }
    }
    if iface.loopback {
        hash.write(loopback_identity);
    }
    hash.finish()
}

/// What tells this host's loopback network from another's: the host name,
/// the boot id, and the network namespace (containers, and test hosts made
/// of namespaces, share the first two).
pub(crate) fn loopback_identity() -> Vec<u8> {
    let mut identity = Vec::new();
    for file in [
        "/proc/sys/kernel/hostname",
        "/proc/sys/kernel/random/boot_id",
    ] {
        identity.extend_from_slice(
            std::fs::read_to_string(file)
                .unwrap_or_default()
                .trim()
                .as_bytes(),
        );
        identity.push(0);
    }
    if let Ok(netns) = std::fs::read_link("/proc/self/ns/net") {
        identity.extend_from_slice(netns.as_os_str().as_encoded_bytes());
    }
    identity
}

/// Names the processes that may read each other's memory by PID
/// (`process_vm_readv`): those on this host's loopback network
/// (the host name, boot id and network namespace that name it) and
/// in one PID namespace, whose PIDs they name each other by. `None` where
/// the boot id or the PID namespace cannot be read: such a process shares
/// memory with nobody. Never 0.
pub fn memory_domain() -> Option<u64> {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    if boot_id.trim().is_empty() {
        return None;
    }
    let pid_namespace = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let mut hash = udbtl_wire::hash::Fnv1a::new();
    hash.write(&loopback_identity());
    hash.write(&[0]);
    hash.write(pid_namespace.as_os_str().as_encoded_bytes());
    Some(hash.finish().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    fn iface(name: &str, loopback: bool, addr: &str, prefix: u8) -> Interface {
        Interface {
            name: name.into(),
            up: true,
            loopback,
            addrs: vec![(ip(addr), prefix)],
        }
    }

    fn host() -> Vec<Interface> {
        vec![
            iface("lo", true, "127.0.0.1", 8),
            iface("eth0", false, "10.1.0.5", 16),
            iface("ib0", false, "192.168.7.5", 24),
        ]
    }

    fn names(selected: &[Interface]) -> Vec<&str> {
        selected.iter().map(|i| i.name.as_str()).collect()
    }

    fn selection<'a>(include: &'a [String], exclude: &'a [String]) -> Selection<'a> {
        Selection {
            include,
            exclude,
            bind: None,
            scope: InterfaceScope::Loopback,
        }
    }

    #[test]
    fn scope_chooses_when_nothing_is_named() {
        let one_host = selection(&[], &[]);
        assert_eq!(names(&select(host(), one_host)), ["lo"]);
        let spans = Selection {
            scope: InterfaceScope::Network,
            ..one_host
        };
        assert_eq!(names(&select(host(), spans)), ["eth0", "ib0"]);
    }

    #[test]
    fn include_by_name_or_subnet_overrides_the_scope() {
        let include = ["ib0".to_owned(), "10.1.0.0/16".to_owned()];
        assert_eq!(
            names(&select(host(), selection(&include, &[]))),
            ["eth0", "ib0"]
        );
        let include = ["lo".to_owned()];
        let spans = Selection {
            scope: InterfaceScope::Network,
            ..selection(&include, &[])
        };
        assert_eq!(names(&select(host(), spans)), ["lo"]);
    }

    #[test]
    fn exclude_applies_to_the_scope_and_to_include() {
        let exclude = ["192.168.0.0/16".to_owned()];
        let spans = Selection {
            scope: InterfaceScope::Network,
            ..selection(&[], &exclude)
        };
        assert_eq!(names(&select(host(), spans)), ["eth0"]);
        let include = ["eth0".to_owned()];
        let exclude = ["eth0".to_owned()];
        assert!(select(host(), selection(&include, &exclude)).is_empty());
    }

    #[test]
    fn bind_picks_the_interface_holding_the_address() {
        let bound = Selection {
            bind: Some(ip("192.168.7.5")),
            ..selection(&[], &[])
        };
        assert_eq!(names(&select(host(), bound)), ["ib0"]);
    }

    #[test]
    fn subnets_match_by_prefix() {
        assert!(same_subnet(ip("10.77.0.2"), ip("10.77.0.0"), 24));
        assert!(!same_subnet(ip("10.77.1.2"), ip("10.77.0.0"), 24));
        assert!(same_subnet(ip("10.77.1.2"), ip("10.0.0.0"), 8));
        assert!(same_subnet(ip("192.168.0.1"), ip("10.0.0.0"), 0));
        assert!(!same_subnet(ip("10.77.0.2"), ip("::1"), 8));
        let v_a = iface("vA", false, "10.77.0.1", 24);
        assert!(interface_matches(&v_a, "vA"));
        assert!(interface_matches(&v_a, "10.77.0.0/24"));
        assert!(!interface_matches(&v_a, "10.78.0.0/24"));
        assert!(!interface_matches(&v_a, "10.77.0.0/x"));
        assert!(!interface_matches(&v_a, "vB"));
    }

    #[test]
    fn loopback_networks_differ_between_hosts_and_namespaces() {
        let lo = iface("lo", true, "127.0.0.1", 8);
        let here = network_id(&lo, ip("127.0.0.1"), 8, b"vm\0boot\0net:[1]");
        let other_ns = network_id(&lo, ip("127.0.0.1"), 8, b"vm\0boot\0net:[2]");
        assert_ne!(here, other_ns);
        let eth = iface("eth0", false, "10.1.0.5", 16);
        assert_eq!(
            network_id(&eth, ip("10.1.0.5"), 16, b"a"),
            network_id(&eth, ip("10.1.9.9"), 16, b"b"),
            "a real subnet is the same network on every host"
        );
    }

    /// Every call names the same domain (the processes of a job compute it
    /// apart and must agree), and a Linux process here has one.
    #[test]
    fn the_memory_domain_is_stable_and_never_zero() {
        let first = memory_domain().expect("a boot id and a PID namespace");
        assert_ne!(first, 0);
        assert_eq!(memory_domain(), Some(first));
    }
}
