//! Socket set-up shared by the floors: address parsing, the largest UDP
//! payload a path carries, buffers, OSU size sweeps and iteration counts.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};

use socket2::{Domain, Protocol, Socket, Type};

use crate::sys;

/// Largest UDP payload over IPv4 (65535 − 20 B IP − 8 B UDP).
pub const UDP_MAX_V4: usize = 65507;
/// Largest UDP payload over IPv6 without jumbograms (65535 − 8 B UDP).
pub const UDP_MAX_V6: usize = 65527;
/// Socket buffers asked for (forced past rmem_max when root): a streaming
/// sender outruns a receiver with the default 208 KiB and loses 3–28 %.
pub const BUFFER_BYTES: usize = 64 << 20;
/// Sizes above this are "large" (fewer iterations), as in OSU.
pub const LARGE: usize = 8192;

/// Errors of socket set-up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The address did not parse or resolve.
    #[error("cannot resolve {addr}: {source}")]
    Resolve {
        /// As given.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A socket call failed.
    #[error("{what}: {source}")]
    Io {
        /// The call and its argument.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A size exceeds what one datagram can carry on this path.
    #[error(
        "{what} {size} B exceeds the largest UDP payload on the path to {peer}: {limit} B \
         ({why}); larger datagrams would fail with EMSGSIZE or be fragmented"
    )]
    TooLarge {
        /// Which option.
        what: &'static str,
        /// Asked for.
        size: usize,
        /// Allowed.
        limit: usize,
        /// The destination.
        peer: SocketAddr,
        /// Where the limit comes from.
        why: String,
    },
}

impl NetError {
    /// Wraps an I/O error with the call that failed.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

/// Resolves `host:port` to its first address.
pub fn resolve(addr: &str) -> Result<SocketAddr, NetError> {
    let mut it = addr.to_socket_addrs().map_err(|source| NetError::Resolve {
        addr: addr.into(),
        source,
    })?;
    it.next().ok_or_else(|| NetError::Resolve {
        addr: addr.into(),
        source: io::Error::new(io::ErrorKind::NotFound, "no address"),
    })
}

/// A nonblocking UDP socket with large buffers, fragmentation forbidden;
/// bound to `bind` when given, connected to `connect` when given.
pub fn udp_socket(
    bind: Option<SocketAddr>,
    connect: Option<SocketAddr>,
) -> Result<UdpSocket, NetError> {
    let family = bind
        .or(connect)
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    let sock = Socket::new(
        Domain::for_address(family),
        Type::DGRAM,
        Some(Protocol::UDP),
    )
    .map_err(|e| NetError::io("socket(UDP)", e))?;
    for recv in [true, false] {
        // Not root: take what rmem_max/wmem_max allow.
        if sys::force_buffer(&sock, recv, BUFFER_BYTES).is_err() {
            let _ = if recv {
                sock.set_recv_buffer_size(BUFFER_BYTES)
            } else {
                sock.set_send_buffer_size(BUFFER_BYTES)
            };
        }
    }
    sys::set_dont_fragment(&sock, family.is_ipv6())
        .map_err(|e| NetError::io("IP_MTU_DISCOVER", e))?;
    if let Some(addr) = bind {
        sock.set_reuse_address(true)
            .map_err(|e| NetError::io("SO_REUSEADDR", e))?;
        sock.bind(&addr.into())
            .map_err(|e| NetError::io(format!("bind {addr}"), e))?;
    }
    if let Some(addr) = connect {
        sock.connect(&addr.into())
            .map_err(|e| NetError::io(format!("connect {addr}"), e))?;
    }
    sock.set_nonblocking(true)
        .map_err(|e| NetError::io("O_NONBLOCK", e))?;
    Ok(sock.into())
}

/// The largest payload one datagram carries on a connected socket's path:
/// the path MTU less the IP and UDP headers, and never above the UDP limit.
pub fn payload_limit(sock: &UdpSocket, peer: SocketAddr) -> Result<(usize, String), NetError> {
    let v6 = peer.is_ipv6();
    let mtu = sys::path_mtu(sock, v6).map_err(|e| NetError::io("getsockopt(IP_MTU)", e))? as usize;
    let headers = if v6 { 48 } else { 28 };
    let max = if v6 { UDP_MAX_V6 } else { UDP_MAX_V4 };
    let by_mtu = mtu.saturating_sub(headers);
    if by_mtu < max {
        Ok((
            by_mtu,
            format!("path MTU {mtu} B less {headers} B of IP and UDP headers"),
        ))
    } else {
        Ok((
            max,
            format!("the UDP payload limit over IPv{}", if v6 { 6 } else { 4 }),
        ))
    }
}

/// Checks `size` against [`payload_limit`].
pub fn check_size(
    what: &'static str,
    size: usize,
    sock: &UdpSocket,
    peer: SocketAddr,
) -> Result<usize, NetError> {
    let (limit, why) = payload_limit(sock, peer)?;
    if size > limit {
        return Err(NetError::TooLarge {
            what,
            size,
            limit,
            peer,
            why,
        });
    }
    Ok(limit)
}

/// The OSU sweep: powers of two from `min` up to `max`, then `max` itself
/// when it is not one (65507 on loopback, 1472 across MTU 1500).
#[must_use]
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = min.max(1).next_power_of_two();
    if min.max(1) < s && min.max(1) <= max {
        out.push(min.max(1));
    }
    while s <= max {
        out.push(s);
        s *= 2;
    }
    if out.last().is_none_or(|&last| last != max) && max >= min.max(1) {
        out.push(max);
    }
    out
}

/// OSU latency counts for a size: (timed, warm-up) iterations.
#[must_use]
pub fn latency_iterations(size: usize) -> (u64, u64) {
    if size <= LARGE {
        (10_000, 1_000)
    } else {
        (1_000, 100)
    }
}

/// OSU bandwidth counts for a size: (timed, warm-up) windows of 64.
#[must_use]
pub fn bw_iterations(size: usize) -> (u64, u64) {
    if size <= LARGE { (100, 10) } else { (20, 2) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_powers_of_two_and_the_limit() {
        assert_eq!(sizes(1, 8), vec![1, 2, 4, 8]);
        assert_eq!(sizes(1, 1472).last(), Some(&1472));
        assert_eq!(sizes(1, 1472)[10], 1024);
        assert_eq!(sizes(3, 8), vec![3, 4, 8]);
        assert_eq!(sizes(1, 1), vec![1]);
    }
}
