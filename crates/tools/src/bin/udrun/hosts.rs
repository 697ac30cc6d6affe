//! Host lists (`--host`, `--hostfile`) and the placement of ranks on them.
//!
//! Placement fills hosts in order, as hydra does by default: the first host
//! takes as many consecutive ranks as it has slots, then the next host, and
//! so on; when every slot is taken and ranks remain, it starts again at the
//! first host (oversubscription, which udrun allows only with
//! `--oversubscribe`). With one slot per host (the default) this
//! is plain round-robin. Placement is O(ranks + hosts).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use udbtl_pmi::ProcessMapping;

/// One entry of a host list: a name and how many ranks it takes per round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostSpec {
    pub(crate) name: String,
    pub(crate) slots: u32,
}

impl HostSpec {
    /// Parses `HOST` or `HOST:SLOTS` (a `--host` item). An IPv6 address
    /// takes slots only in brackets: `[::1]:2`.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (name, slots) = match text.rsplit_once(':') {
            Some((name, slots))
                if !name.contains(':') || (name.starts_with('[') && name.ends_with(']')) =>
            {
                (name, Some(slots))
            }
            _ => (text, None),
        };
        let name = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("invalid host name {text:?}"));
        }
        let slots = match slots {
            None => 1,
            Some(slots) => parse_slots(slots)?,
        };
        Ok(Self {
            name: name.to_owned(),
            slots,
        })
    }
}

fn parse_slots(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(0) | Err(_) => Err(format!(
            "invalid slot count {text:?}: expected a whole number from 1"
        )),
        Ok(n) => Ok(n),
    }
}

/// A hostfile that cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostfileError {
    /// The file cannot be read.
    #[error("cannot read hostfile {}: {}", path.display(), crate::os_message(source))]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line does not parse.
    #[error("hostfile {}, line {line}: {reason}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    /// No host in the file.
    #[error("hostfile {} names no host", path.display())]
    Empty { path: PathBuf },
}

/// Reads a hostfile: one host per line, `HOST`, `HOST slots=N` or
/// `HOST:N`; `#` starts a comment; blank lines are skipped.
pub(crate) fn read_hostfile(path: &Path) -> Result<Vec<HostSpec>, HostfileError> {
    let text = std::fs::read_to_string(path).map_err(|source| HostfileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let hosts = parse_hostfile(&text).map_err(|(line, reason)| HostfileError::Line {
        path: path.to_owned(),
        line,
        reason,
    })?;
    if hosts.is_empty() {
        return Err(HostfileError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(hosts)
}

/// The hosts of a hostfile's text, or the 1-based line that is wrong and why.
fn parse_hostfile(text: &str) -> Result<Vec<HostSpec>, (usize, String)> {
    let mut hosts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.split_once('#').map_or(line, |(before, _)| before);
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else {
            continue;
        };
        let fail = |reason: String| (index + 1, reason);
        let mut host = HostSpec::parse(first).map_err(fail)?;
        for word in words {
            match word.strip_prefix("slots=") {
                Some(n) => host.slots = parse_slots(n).map_err(fail)?,
                None => return Err(fail(format!("unexpected {word:?} (expected slots=N)"))),
            }
        }
        hosts.push(host);
    }
    Ok(hosts)
}

/// Where a rank runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The remote host, or `None` for this machine.
    pub(crate) host: Option<String>,
    /// The rank's index among the ranks on its machine.
    pub(crate) local_rank: u32,
    /// How many ranks its machine runs.
    pub(crate) local_size: u32,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            None => f.write_str("this host"),
            Some(host) => f.write_str(host),
        }
    }
}

/// Whether `name` is this machine: `localhost`, a loopback address, or its
/// host name (`this_host`, compared with and without a domain).
pub(crate) fn is_local(name: &str, this_host: Option<&str>) -> bool {
    let short = |n: &str| n.split('.').next().unwrap_or(n).to_ascii_lowercase();
    let lower = name.to_ascii_lowercase();
    matches!(lower.as_str(), "localhost" | "::1")
        || lower.starts_with("127.")
        || this_host.is_some_and(|h| {
            h.eq_ignore_ascii_case(name) || (!name.contains('.') && short(h) == lower)
        })
}

/// How many slots `hosts` has in all.
pub(crate) fn total_slots(hosts: &[HostSpec]) -> u64 {
    hosts.iter().map(|h| u64::from(h.slots)).sum()
}

/// Places `ranks` ranks on `hosts` (all on this machine when `hosts` is
/// empty): see the [module docs](self).
pub(crate) fn place(ranks: u32, hosts: &[HostSpec], this_host: Option<&str>) -> Vec<Placement> {
    let n = ranks as usize;
    let mut placed: Vec<Option<&str>> = Vec::with_capacity(n);
    if hosts.is_empty() {
        placed.resize(n, None);
    }
    'fill: while !hosts.is_empty() {
        for host in hosts {
            let machine = (!is_local(&host.name, this_host)).then_some(host.name.as_str());
            for _ in 0..host.slots {
                if placed.len() == n {
                    break 'fill;
                }
                placed.push(machine);
            }
        }
    }
    let mut sizes: HashMap<Option<&str>, u32> = HashMap::new();
    let local_ranks: Vec<u32> = placed
        .iter()
        .map(|machine| {
            let count = sizes.entry(*machine).or_default();
            *count += 1;
            *count - 1
        })
        .collect();
    placed
        .iter()
        .zip(local_ranks)
        .map(|(machine, local_rank)| Placement {
            host: machine.map(str::to_owned),
            local_rank,
            local_size: sizes.get(machine).copied().unwrap_or(1),
        })
        .collect()
}

/// The `PMI_process_mapping` of `placements`: nodes numbered in the order
/// the ranks first reach them.
pub(crate) fn process_mapping(placements: &[Placement]) -> ProcessMapping {
    let mut numbers: HashMap<Option<&str>, u32> = HashMap::new();
    let nodes: Vec<u32> = placements
        .iter()
        .map(|p| {
            let next = u32::try_from(numbers.len()).unwrap_or(u32::MAX);
            *numbers.entry(p.host.as_deref()).or_insert(next)
        })
        .collect();
    ProcessMapping::from_nodes(&nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_numbers_nodes_as_ranks_reach_them() {
        let hosts = [host("localhost", 1), host("b", 2)];
        let placements = place(4, &hosts, None);
        assert_eq!(
            process_mapping(&placements).to_string(),
            "(vector,(0,1,1),(1,1,2),(0,1,1))"
        );
        assert_eq!(process_mapping(&place(3, &[], None)).node_count(), 1);
    }

    fn host(name: &str, slots: u32) -> HostSpec {
        HostSpec {
            name: name.into(),
            slots,
        }
    }

    #[test]
    fn host_items() {
        assert_eq!(HostSpec::parse("n1").unwrap(), host("n1", 1));
        assert_eq!(HostSpec::parse("n1:4").unwrap(), host("n1", 4));
        assert_eq!(HostSpec::parse("[::1]:2").unwrap(), host("::1", 2));
        assert_eq!(HostSpec::parse("fe80::1").unwrap(), host("fe80::1", 1));
        assert!(HostSpec::parse("n1:0").is_err());
        assert!(HostSpec::parse("n1:x").is_err());
        assert!(HostSpec::parse("").is_err());
    }

    #[test]
    fn hostfile_lines() {
        let hosts = parse_hostfile("# cluster\nn1 slots=2\n\n  n2   # one slot\nn3:3\n").unwrap();
        assert_eq!(hosts, [host("n1", 2), host("n2", 1), host("n3", 3)]);
        assert_eq!(parse_hostfile("n1\nn2 cpus=4\n").unwrap_err().0, 2);
        assert_eq!(parse_hostfile("n1 slots=0\n").unwrap_err().0, 1);
    }

    #[test]
    fn local_names() {
        for name in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "::1",
            "vm",
            "vm.example.org",
        ] {
            assert!(is_local(name, Some("vm.example.org")), "{name}");
        }
        assert!(is_local("vm", Some("vm")));
        assert!(!is_local("vm2", Some("vm")));
        assert!(!is_local("vm.other.org", Some("vm")));
        assert!(!is_local("n1", None));
    }

    #[test]
    fn placement_fills_hosts_in_order_and_wraps() {
        let hosts = [host("a", 2), host("localhost", 1), host("b", 1)];
        let placed = place(6, &hosts, Some("vm"));
        let names: Vec<_> = placed.iter().map(|p| p.host.as_deref()).collect();
        assert_eq!(
            names,
            [Some("a"), Some("a"), None, Some("b"), Some("a"), Some("a")]
        );
        let local: Vec<_> = placed
            .iter()
            .map(|p| (p.local_rank, p.local_size))
            .collect();
        assert_eq!(local, [(0, 4), (1, 4), (0, 1), (0, 1), (2, 4), (3, 4)]);
        let all_here = place(3, &[], None);
        assert!(
            all_here
                .iter()
                .all(|p| p.host.is_none() && p.local_size == 3)
        );
        assert_eq!(all_here[2].local_rank, 2);
    }
}
