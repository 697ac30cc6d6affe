//! The opened `udp` device: [`UdpContext`], its queue pairs' sockets, and
//! its [`Context`] implementation.
//!
//! The context owns the shared bookkeeping ([`Verbs`]) and each queue pair's
//! socket; it hands the bookkeeping to its [`Sender`] for posting sends and
//! to its [`Receiver`] for receives while a completion queue is polled.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use socket2::{Domain, Protocol, Socket, Type};

use super::recv::{Receiver, UdpQp};
use super::send::{self, Sender};
use super::{UdpConfig, sys};
use crate::bookkeeping::Verbs;
use crate::channel::Registration;
use crate::{
    AhAttr, AhHandle, CompletionChannel, Context, CqHandle, FabricError, FabricStats, NodeAddr,
    PdHandle, PortAttr, PostError, QpAddr, QpHandle, QpInfo, QpInitAttr, RecvWr, ResourceCounts,
    Result, SendWr, WorkCompletion,
};

/// An opened `udp` device.
#[derive(Debug)]
pub struct UdpContext {
    verbs: Verbs<UdpQp, IpAddr>,
    ip: IpAddr,
    /// The UDP payload of each piece of a long datagram, if the port
    /// segments (`segment/`).
    segment: Option<usize>,
    config: UdpConfig,
    /// Posting sends.
    tx: Sender,
    /// Receiving, while a completion queue is polled.
    rx: Receiver,
    /// Completion channels made by this context, with the completion queue
    /// each watches: a queue pair receiving into that queue has its socket
    /// registered with the channel for as long as both live.
    channels: Vec<(CqHandle, Registration)>,
}

impl UdpContext {
    /// A context over `verbs` whose queue pairs bind to `ip`; `gro` says
    /// whether new queue pairs turn UDP GRO on, `segment` the UDP payload
    /// of the pieces a long datagram is cut into, if the port segments.
    pub(super) fn new(
        verbs: Verbs<UdpQp, IpAddr>,
        ip: IpAddr,
        config: UdpConfig,
        gro: bool,
        segment: Option<usize>,
    ) -> Self {
        Self {
            verbs,
            ip,
            segment,
            tx: Sender::new(config.gso, segment),
            rx: Receiver::new(gro),
            config,
            channels: Vec::new(),
        }
    }

    /// The address queue pairs bind to.
    pub const fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The full address of a queue pair, as peers would address it.
    ///
    /// # Errors
    /// Bad handle.
    pub fn qp_addr(&self, qp: QpHandle) -> Result<QpAddr> {
        let entry = self.verbs.qp(qp)?;
        Ok(QpAddr {
            node: NodeAddr::Ip(self.ip),
            qpn: entry.qp_num,
        })
    }

    fn open_socket(&self) -> Result<Socket> {
        let io = |operation| move |source| FabricError::Io { operation, source };
        let domain = if self.ip.is_ipv6() {
            Domain::IPV6
        } else {
            Domain::IPV4
        };
        let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).map_err(io("socket"))?;
        if self.ip.is_ipv6() {
            socket
                .set_only_v6(true)
                .map_err(io("setsockopt(IPV6_V6ONLY)"))?;
        }
        socket
            .set_nonblocking(true)
            .map_err(io("fcntl(O_NONBLOCK)"))?;
        socket
            .bind(&SocketAddr::new(self.ip, 0).into())
            .map_err(io("bind"))?;
        size_buffer(&socket, false, self.config.send_buffer);
        size_buffer(&socket, true, self.config.recv_buffer);
        if self.config.busy_poll_us > 0 {
            if let Err(err) = socket.set_busy_poll(self.config.busy_poll_us) {
                tracing::warn!(%err, "SO_BUSY_POLL refused; receiving without busy-polling the device");
            }
        }
        Ok(socket)
    }
}

/// The host's monotonic clock, from an epoch fixed the first time any
/// context reads it: every context of the process shares it.
fn monotonic_since_epoch() -> std::time::Duration {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed()
}

/// Whether a capped send buffer, and a capped receive buffer, were
/// reported: once per process, not once per socket.
static BUFFER_CAP_REPORTED: [std::sync::atomic::AtomicBool; 2] = [
    std::sync::atomic::AtomicBool::new(false),
    std::sync::atomic::AtomicBool::new(false),
];

/// Sets a socket buffer size, forcing past the sysctl cap where the process
/// may, and warns (once per process) when the kernel grants less than
/// asked.
fn size_buffer(socket: &Socket, receive: bool, bytes: usize) {
    let name = if receive { "SO_RCVBUF" } else { "SO_SNDBUF" };
    let set = if receive {
        socket.set_recv_buffer_size(bytes)
    } else {
        socket.set_send_buffer_size(bytes)
    };
    if let Err(err) = set {
        tracing::warn!(%err, option = name, bytes, "could not size socket buffer");
    }
    let granted = || {
        if receive {
            socket.recv_buffer_size()
        } else {
            socket.send_buffer_size()
        }
    };
    // Linux reports double the size granted, to account for bookkeeping:
    // a cap between half the request and the request shows as more than
    // the request, so the reported size is halved before comparing.
    let short = |got: usize| got / 2 < bytes;
    if granted().is_ok_and(short) {
        let _ = sys::force_buffer(socket.as_fd(), receive, bytes);
        match granted() {
            Ok(got)
                if short(got)
                    && !BUFFER_CAP_REPORTED[usize::from(receive)]
                        .swap(true, std::sync::atomic::Ordering::Relaxed) =>
            {
                let sysctl = if receive {
                    "net.core.rmem_max"
                } else {
                    "net.core.wmem_max"
                };
                tracing::warn!(
                    "the kernel capped {name} at {} bytes, below the {bytes} asked for \
                     (udp_sockbuf): bursts may overflow the socket and be retransmitted; \
                     raise {sysctl} to at least {bytes} (sysctl -w {sysctl}={bytes}), or \
                     run with CAP_NET_ADMIN",
                    got / 2
                );
            }
            _ => {}
        }
    }
}

impl Context for UdpContext {
    crate::bookkeeping::delegate_to_verbs!();

    fn check_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        send::check_udp_send(&self.verbs, self.verbs.qp(qp)?, wr)
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.verbs.port(port).cloned()
    }

    fn create_qp(&mut self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpInfo> {
        let cap = self.verbs.check_qp_init(pd, attr)?;
        let socket = self.open_socket()?;
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .ok_or_else(|| FabricError::Io {
                operation: "getsockname",
                source: io::Error::other("no local address"),
            })?;
        let slot = self.verbs.port(1)?.max_msg_size + udbtl_wire::ud::HEADER_LEN;
        let rx = self.rx.new_qp(&socket, slot, self.segment);
        // Should anything below fail, closing the socket takes it out of
        // every epoll set it joined.
        for (_, channel) in self.channels.iter().filter(|(c, _)| *c == attr.recv_cq) {
            channel
                .add(socket.as_fd())
                .map_err(|source| FabricError::Io {
                    operation: "epoll_ctl(EPOLL_CTL_ADD)",
                    source,
                })?;
        }
        self.verbs
            .insert_qp(pd, attr, cap, u32::from(port), UdpQp { socket, rx })
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<()> {
        let recv_cq = self.verbs.qp(qp)?.recv_cq;
        let transport = self.verbs.remove_qp(qp)?;
        self.rx.partials.forget(qp);
        // Closing the socket would end its epoll registrations too; removing
        // them first keeps that independent of who else holds the socket.
        for (_, channel) in self.channels.iter().filter(|(c, _)| *c == recv_cq) {
            channel.remove(transport.socket.as_fd());
        }
        Ok(())
    }

    fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let NodeAddr::Ip(ip) = attr.dest else {
            return Err(FabricError::InvalidArgument {
                what: "address handle",
                detail: format!("{} is not an IP address", attr.dest),
            });
        };
        if ip.is_ipv6() != self.ip.is_ipv6() {
            return Err(FabricError::InvalidArgument {
                what: "address handle",
                detail: format!("{ip} is not reachable from a socket bound to {}", self.ip),
            });
        }
        self.verbs.insert_ah(pd, attr, ip)
    }

    fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.verbs.post_recv_newest_first(qp, wrs)?;
        if let Ok(entry) = self.verbs.qp_mut(qp) {
            entry.transport.rx.posted();
        }
        Ok(())
    }

    fn post_send(&mut self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.tx.post(&mut self.verbs, qp, wrs)
    }

    fn poll_cq(&mut self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        let queued = self
            .verbs
            .cqs
            .get(cq.0)
            .map(crate::bookkeeping::CqEntry::queued)
            .ok_or(FabricError::InvalidHandle {
                kind: "completion queue",
            })?;
        if queued < out.len() {
            self.rx.receive(&mut self.verbs, cq, out.len() - queued)?;
        }
        self.verbs.drain_completions(cq, out)
    }

    fn completion_channel(&mut self, cq: CqHandle) -> Result<Option<CompletionChannel>> {
        if self.verbs.cqs.get(cq.0).is_none() {
            return Err(FabricError::InvalidHandle {
                kind: "completion queue",
            });
        }
        let io = |operation| move |source| FabricError::Io { operation, source };
        let (channel, registration) = CompletionChannel::new().map_err(io("epoll_create"))?;
        for (_, qp) in self.verbs.qps.iter().filter(|(_, qp)| qp.recv_cq == cq) {
            registration
                .add(qp.transport.socket.as_fd())
                .map_err(io("epoll_ctl(EPOLL_CTL_ADD)"))?;
        }
        // Forget channels that are gone or whose queue was destroyed.
        let cqs = &self.verbs.cqs;
        self.channels
            .retain(|(c, r)| r.is_live() && cqs.get(c.0).is_some());
        self.channels.push((cq, registration));
        Ok(Some(channel))
    }

    fn now(&self) -> std::time::Duration {
        monotonic_since_epoch()
    }

    fn stats(&self) -> FabricStats {
        let mut stats = self.verbs.stats;
        stats.rx_kernel_drops = self
            .verbs
            .qps
            .iter()
            .filter_map(|(_, qp)| sys::socket_drops(qp.transport.socket.as_fd()))
            .sum();
        stats
    }

    fn resources(&self) -> ResourceCounts {
        self.verbs.resources()
    }
}
