//! A process's IPv4 sockets, as any local user finds them in `/proc`: the
//! socket inodes among its descriptors, matched against its network
//! namespace's table (`/proc/PID/net/udp` or `tcp`). For tests that play a
//! stranger on the host; included with `#[path]`, since tests of different
//! crates share no module otherwise.

// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddrV4};

/// The `st` column of a listening TCP socket.
pub(crate) const TCP_LISTEN: &str = "0A";

/// The local addresses of the sockets process `pid` holds in `table`
/// (`"udp"` or `"tcp"`), only those in state `state` if given.
pub(crate) fn sockets(pid: u32, table: &str, state: Option<&str>) -> Vec<SocketAddrV4> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|target| {
                    let target = target.to_string_lossy().into_owned();
                    Some(
                        target
                            .strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let rows = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
    rows.lines()
        .skip(1)
        .filter_map(|row| {
            let cols: Vec<&str> = row.split_whitespace().collect();
            let (ip, port) = cols.get(1)?.split_once(':')?;
            let inode = cols.get(9)?;
            if state.is_some_and(|s| cols.get(3) != Some(&s)) || !inodes.iter().any(|i| i == inode)
            {
                return None;
            }
            // The kernel prints the address's four bytes as one native
            // integer.
            let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes());
            Some(SocketAddrV4::new(ip, u16::from_str_radix(port, 16).ok()?))
        })
        .collect()
}
