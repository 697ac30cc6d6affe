//! The `udp` provider: UD verbs over kernel UDP sockets.
//!
//! Each queue pair is one nonblocking UDP socket bound to the context's IP
//! address. Where verbs address a queue pair by (LID, QPN), this provider uses
//! (IP address, UDP port): an address handle holds the IP address and the QP
//! number is the socket's port. Every datagram carries the UD encapsulation
//! header of [`udbtl_wire::ud`] with the partition and queue keys the receiver
//! checks.
//!
//! Sends go out with `sendmmsg`, one system call per posted batch; equal-sized
//! datagrams to one destination are coalesced with UDP GSO (`UDP_SEGMENT`)
//! when the kernel supports it. Receives land in place in the posted buffers,
//! with `recvmmsg`, while [`Context::poll_cq`] runs.
//!
//! The kernel's refusals behave like a lossy wire: ENOBUFS, EAGAIN, EPERM (a
//! firewall drop on the output path) and ICMP errors make the datagram lost
//! and counted in [`FabricStats::tx_kernel_drops`]; the send still completes,
//! as a UD send does once the datagram has left the HCA.

mod netif;
mod sys;

pub use netif::InterfaceScope;

use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use socket2::{Domain, Protocol, Socket, Type};
use udbtl_wire::ud;

use crate::bookkeeping::{Memory, QpEntry, Verbs};
use crate::channel::Registration;
use crate::{
    AhAttr, AhHandle, CompletionChannel, Context, CqHandle, DeviceAttr, DeviceInfo, FabricError,
    FabricStats, GRH_LEN, MrHandle, NodeAddr, PdHandle, PortAttr, PortState, PostError, Provider,
    QpAddr, QpHandle, QpInfo, QpInitAttr, RecvWr, ResourceCounts, Result, SendWr, Sge, WcOpcode,
    WcStatus, WorkCompletion,
};

/// The provider's name.
pub const NAME: &str = "udp";

/// Largest UDP payload over IPv4 (65535 − 20 − 8).
const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload over IPv6 (65535 − 8; the IPv6 header is not counted).
const MAX_UDP_PAYLOAD_V6: usize = 65_527;
/// Most datagrams one GSO send may carry (the kernel's UDP_MAX_SEGMENTS).
const MAX_GSO_SEGMENTS: usize = 64;
/// Most gather entries a send may have besides the UD header.
const MAX_SEND_SGE: u32 = 8;
/// Empty queue pairs that never had a receive posted are drained (and their
/// datagrams counted as dropped) only every this many polls, so send-only
/// queue pairs cost no system call on the fast path.
const IDLE_DRAIN_INTERVAL: u32 = 64;
/// Most datagrams (or GRO trains) one drain of a queue pair with no
/// receive posted reads: the rest wait for the next.
const DISCARD_MAX: usize = 64;

/// Configuration of the `udp` provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpConfig {
    /// Address to bind queue pairs to. Selects the device that holds it.
    pub bind: Option<IpAddr>,
    /// Interfaces to offer as devices, by name (`eth0`) or by a subnet one of
    /// their addresses is in (`10.77.0.0/24`). When empty, and `bind`
    /// is unset, [`scope`](Self::scope) chooses.
    pub interfaces: Vec<String>,
    /// Interfaces never to offer, by name or subnet, whatever chose them.
    pub exclude: Vec<String>,
    /// The interfaces offered when neither `interfaces` nor `bind` names
    /// any: loopback (the default, for a job on one host) or every other
    /// interface (for a job that spans hosts).
    pub scope: InterfaceScope,
    /// Prefer IPv6 addresses when choosing a device's address.
    pub ipv6: bool,
    /// Largest payload per datagram. Defaults to the largest datagram on
    /// loopback, and to the interface MTU less the IP and UDP headers
    /// elsewhere, so that IP never fragments.
    pub mtu: Option<usize>,
    /// Requested `SO_SNDBUF` in bytes.
    pub send_buffer: usize,
    /// Requested `SO_RCVBUF` in bytes.
    pub recv_buffer: usize,
    /// Coalesce equal-sized datagrams with UDP GSO.
    pub gso: bool,
    /// Receive coalesced trains with UDP GRO, and split them back into
    /// datagrams. Used where a train can form: on ports whose datagrams are
    /// at most half the largest UDP payload (an MTU-sized path, not
    /// loopback's 64 KiB datagrams).
    pub gro: bool,
    /// Microseconds a receive on an empty socket may spend polling the
    /// device's queue itself (`SO_BUSY_POLL`), instead of waiting for the
    /// softirq to deliver; 0 leaves it off. Acts only on devices with NAPI
    /// receive queues; setting it needs `CAP_NET_ADMIN`, and a refusal
    /// leaves it off with a warning.
    pub busy_poll_us: u32,
}

impl Default for UdpConfig {
    fn default() -> Self {
        Self {
            bind: None,
            interfaces: Vec::new(),
            exclude: Vec::new(),
            scope: InterfaceScope::Loopback,
            ipv6: false,
            mtu: None,
            send_buffer: 4 << 20,
            recv_buffer: 4 << 20,
            gso: true,
            gro: true,
            busy_poll_us: 0,
        }
    }
}

/// The `udp` provider.
#[derive(Debug, Clone, Default)]
pub struct UdpProvider {
    config: UdpConfig,
}

impl UdpProvider {
    /// A provider with the given configuration.
    pub const fn new(config: UdpConfig) -> Self {
        Self { config }
    }

    /// The configuration.
    pub const fn config(&self) -> &UdpConfig {
        &self.config
    }

    /// The entries of the configured `interfaces` (names or subnets) that
    /// match none of the host's interfaces, and the host's interfaces as
    /// `name (address, ...)`, for an error that names both.
    ///
    /// # Errors
    /// The interfaces could not be listed.
    pub fn unmatched_interfaces(&self) -> Result<(Vec<String>, Vec<String>)> {
        let all = sys::interfaces().map_err(|source| FabricError::Io {
            operation: "getifaddrs",
            source,
        })?;
        let missing = self
            .config
            .interfaces
            .iter()
            .filter(|wanted| {
                !all.iter()
                    .any(|iface| netif::interface_matches(iface, wanted))
            })
            .cloned()
            .collect();
        let present = all
            .iter()
            .map(|iface| {
                let addrs: Vec<String> = iface
                    .addrs
                    .iter()
                    .map(|(ip, prefix)| format!("{ip}/{prefix}"))
                    .collect();
                if addrs.is_empty() {
                    iface.name.clone()
                } else {
                    format!("{} ({})", iface.name, addrs.join(", "))
                }
            })
            .collect();
        Ok((missing, present))
    }

    fn selected_interfaces(&self) -> Result<Vec<sys::Interface>> {
        let all = sys::interfaces().map_err(|source| FabricError::Io {
            operation: "getifaddrs",
            source,
        })?;
        Ok(netif::select(
            all,
            netif::Selection {
                include: &self.config.interfaces,
                exclude: &self.config.exclude,
                bind: self.config.bind,
                scope: self.config.scope,
            },
        ))
    }

    /// The address (and prefix length) queue pairs of `iface` bind to.
    fn address_of(&self, iface: &sys::Interface) -> Option<(IpAddr, u8)> {
        if let Some(bind) = self.config.bind {
            return iface.addrs.iter().find(|(ip, _)| *ip == bind).copied();
        }
        let family = |(ip, _): &&(IpAddr, u8)| ip.is_ipv6() == self.config.ipv6;
        let usable = |(ip, _): &&(IpAddr, u8)| match ip {
            IpAddr::V6(v6) => !v6.is_unicast_link_local(),
            IpAddr::V4(_) => true,
        };
        iface.addrs.iter().filter(family).find(usable).copied()
    }

    fn max_msg_size(&self, iface: &sys::Interface, ip: IpAddr) -> Result<usize> {
        let limit = if iface.loopback {
            if ip.is_ipv6() {
                MAX_UDP_PAYLOAD_V6
            } else {
                MAX_UDP_PAYLOAD_V4
            }
        } else {
            let link_mtu = std::fs::read_to_string(format!("/sys/class/net/{}/mtu", iface.name))
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .unwrap_or(1500);
            let ip_header = if ip.is_ipv6() { 40 } else { 20 };
            link_mtu.saturating_sub(ip_header + 8)
        };
        let limit = limit.saturating_sub(ud::HEADER_LEN);
        match self.config.mtu {
            None => Ok(limit),
            Some(mtu) if mtu > 0 && mtu <= limit => Ok(mtu),
            Some(mtu) => Err(FabricError::InvalidArgument {
                what: "udp mtu",
                detail: format!("{mtu} is outside 1..={limit} for {}", iface.name),
            }),
        }
    }
}

fn device_attr() -> DeviceAttr {
    DeviceAttr {
        max_qp: 1024,
        max_qp_wr: 65_536,
        max_sge: MAX_SEND_SGE,
        max_cq: 1024,
        max_cqe: 1 << 20,
        max_mr: 1 << 16,
        max_ah: 1 << 20,
        max_inline_data: 1024,
    }
}

impl Provider for UdpProvider {
    type Context = UdpContext;

    fn name(&self) -> &'static str {
        NAME
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        Ok(self
            .selected_interfaces()?
            .into_iter()
            .map(|iface| DeviceInfo {
                name: iface.name,
                provider: NAME,
                port_count: 1,
                attr: device_attr(),
            })
            .collect())
    }

    fn open(&self, device: &str) -> Result<UdpContext> {
        let iface = self
            .selected_interfaces()?
            .into_iter()
            .find(|iface| iface.name == device)
            .ok_or_else(|| FabricError::NoSuchDevice {
                provider: NAME,
                name: device.into(),
            })?;
        let addr = self.address_of(&iface);
        let (ip, prefix) = addr.unwrap_or(if self.config.ipv6 {
            (IpAddr::from([0u16; 8]), 0)
        } else {
            (IpAddr::from([0u8; 4]), 0)
        });
        let port = PortAttr {
            port_num: 1,
            state: if iface.up && addr.is_some() {
                PortState::Active
            } else {
                PortState::Down
            },
            addr: NodeAddr::Ip(ip),
            max_msg_size: self.max_msg_size(&iface, ip)?,
            network: netif::network_id(&iface, ip, prefix, &netif::loopback_identity()),
            pkeys: vec![0xffff],
            link_layer: if ip.is_ipv6() { "udp/ipv6" } else { "udp/ipv4" },
        };
        let info = DeviceInfo {
            name: iface.name.clone(),
            provider: NAME,
            port_count: 1,
            attr: device_attr(),
        };
        // A train forms only where two datagrams fit one UDP payload.
        let gro = self.config.gro && port.max_msg_size + ud::HEADER_LEN <= MAX_UDP_PAYLOAD_V4 / 2;
        Ok(UdpContext {
            verbs: Verbs::new(info, vec![port]),
            ip,
            config: self.config.clone(),
            gso: self.config.gso,
            gro,
            gro_overflow: None,
            polls: 0,
            channels: Vec::new(),
            drop_scratch: vec![0u8; MAX_UDP_PAYLOAD_V6 + GRH_LEN].into_boxed_slice(),
            scratch: Box::new(RecvScratch {
                targets: [(0, 0); sys::MAX_BATCH],
                meta: [sys::RecvMeta::EMPTY; sys::MAX_BATCH],
            }),
        })
    }
}

/// A queue pair's socket.
#[derive(Debug)]
pub(crate) struct UdpQp {
    socket: Socket,
    /// A receive was posted at least once: the queue pair receives, so an
    /// empty receive queue must drop arrivals promptly.
    receives: bool,
    /// How many datagrams the next receive batch asks for. It doubles while
    /// consecutive polls keep finding full batches and halves on an empty
    /// poll, so a ping-pong reads with one `recvfrom` per poll and a stream
    /// grows to full `recvmmsg` batches within a few polls.
    batch_hint: usize,
    /// Consecutive polls that found data.
    busy_polls: u32,
    /// The socket has UDP GRO on: a read may return a train.
    gro: bool,
}

/// An opened `udp` device.
#[derive(Debug)]
pub struct UdpContext {
    verbs: Verbs<UdpQp, IpAddr>,
    ip: IpAddr,
    config: UdpConfig,
    /// GSO is used until the kernel refuses it once.
    gso: bool,
    /// New queue pairs turn GRO on, until the kernel refuses it once.
    gro: bool,
    /// Where a GRO train continues past the buffer its first datagram
    /// landed in: [`sys::GRO_OVERFLOW`] bytes per datagram of a receive
    /// batch, made with the first queue pair that has GRO on.
    gro_overflow: Option<Box<[u8]>>,
    polls: u32,
    /// Completion channels made by this context, with the completion queue
    /// each watches: a queue pair receiving into that queue has its socket
    /// registered with the channel for as long as both live.
    channels: Vec<(CqHandle, Registration)>,
    /// Where datagrams that no receive was posted for are read and discarded.
    drop_scratch: Box<[u8]>,
    /// Per-batch receive bookkeeping, kept here so a poll prepares nothing.
    scratch: Box<RecvScratch>,
}

/// What one `recvmmsg` batch needs besides the buffers themselves.
#[derive(Debug)]
struct RecvScratch {
    targets: [(usize, usize); sys::MAX_BATCH],
    meta: [sys::RecvMeta; sys::MAX_BATCH],
}

const INVALID_QP: FabricError = FabricError::InvalidHandle { kind: "queue pair" };

impl UdpContext {
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

    /// Turns GRO on for a new queue pair's socket; says whether it is on.
    fn enable_gro(&mut self, socket: &Socket) -> bool {
        if let Err(err) = sys::enable_gro(socket.as_fd()) {
            tracing::debug!(%err, "UDP GRO refused by the kernel; receiving datagrams singly");
            self.gro = false;
            return false;
        }
        if self.gro_overflow.is_none() {
            self.gro_overflow =
                Some(vec![0u8; sys::MAX_BATCH * sys::GRO_OVERFLOW].into_boxed_slice());
        }
        true
    }

    /// Pulls datagrams for every receiving queue pair on `cq` into it.
    fn receive(&mut self, cq: CqHandle, budget: usize) -> Result<()> {
        self.polls = self.polls.wrapping_add(1);
        let idle_drain = self.polls % IDLE_DRAIN_INTERVAL == 0;
        let handles: [Option<QpHandle>; 8] = {
            let mut out = [None; 8];
            let mut n = 0;
            for (handle, qp) in self.verbs.qps.iter() {
                if qp.recv_cq == cq && qp.can_receive() && n < out.len() {
                    let empty = qp.recv_queue.is_empty();
                    if !empty || qp.transport.receives || idle_drain {
                        out[n] = Some(QpHandle(handle));
                        n += 1;
                    }
                }
            }
            out
        };
        let mut budget = budget;
        for qp in handles.into_iter().flatten() {
            budget = budget.min(self.verbs.cq_room(cq));
            if budget == 0 {
                break;
            }
            // A GRO train may complete more datagrams than the budget asked
            // for (its tail goes wherever the completion queue has room).
            budget = budget.saturating_sub(self.receive_on(qp, budget)?);
        }
        Ok(())
    }

    /// Receives up to `budget` datagrams on one queue pair and returns how
    /// many completions it queued.
    fn receive_on(&mut self, qp: QpHandle, budget: usize) -> Result<usize> {
        let mut queued = 0;
        loop {
            let entry = self.verbs.qp(qp)?;
            let Some(first) = entry.recv_queue.front().copied() else {
                self.discard_unbuffered(qp)?;
                return Ok(queued);
            };
            // One batch reads into one registration: posted buffers normally
            // all come from a single receive slab.
            let scratch = &mut *self.scratch;
            let limit = (budget - queued).min(entry.transport.batch_hint);
            let mut count = 0;
            for wr in entry.recv_queue.iter().take(limit) {
                if wr.sge.lkey != first.sge.lkey {
                    break;
                }
                scratch.targets[count] = (wr.sge.offset, wr.sge.len);
                count += 1;
            }
            let mr = self.verbs.owned_range(first.sge, entry.pd)?;
            let received = {
                let Verbs { mrs, qps, .. } = &mut self.verbs;
                let transport = &qps.get(qp.0).ok_or(INVALID_QP)?.transport;
                let socket = &transport.socket;
                let overflow = match &mut self.gro_overflow {
                    Some(space) if transport.gro => Some(&mut space[..]),
                    _ => None,
                };
                let region = match mrs.get_mut(mr.0).map(|m| &mut m.memory) {
                    Some(Memory::Owned(bytes)) => &mut bytes[..],
                    _ => {
                        return Err(FabricError::ProtectionError {
                            lkey: first.sge.lkey,
                        });
                    }
                };
                sys::recv_batch(
                    socket.as_fd(),
                    region,
                    &scratch.targets[..count],
                    &mut scratch.meta,
                    transport.gro,
                    overflow,
                )
                .map_err(|source| FabricError::Io {
                    operation: "recvmmsg",
                    source,
                })?
            };
            let transport = &mut self.verbs.qp_mut(qp)?.transport;
            if received == 0 {
                if queued == 0 {
                    transport.busy_polls = 0;
                    transport.batch_hint = (transport.batch_hint / 2).max(1);
                }
                return Ok(queued);
            }
            if queued == 0 {
                transport.busy_polls = transport.busy_polls.saturating_add(1);
            }
            let full = received == count;
            if full && transport.busy_polls >= 2 {
                transport.batch_hint = (count * 2).min(sys::MAX_BATCH);
            }
            queued += self.complete_receives(qp, mr, received)?;
            // A full batch of more than one suggests more are waiting.
            if !full || count == 1 || queued >= budget {
                return Ok(queued);
            }
        }
    }

    /// Turns the `received` datagrams in the scratch space, which landed in
    /// the first posted buffers of `qp` (all in registration `mr`), into
    /// completions. A datagram that is malformed or carries the wrong keys
    /// leaves its buffer posted.
    ///
    /// A coalesced GRO train is split back into its datagrams: the first
    /// landed in place; each later one is copied into the next posted buffer
    /// of the same registration, so that completions stay one per datagram,
    /// in arrival order. A train longer than the buffers posted loses its
    /// tail, as UD drops a datagram that finds no receive.
    fn complete_receives(&mut self, qp: QpHandle, mr: MrHandle, received: usize) -> Result<usize> {
        const SKIP: usize = GRH_LEN - ud::HEADER_LEN;
        let Verbs {
            qps,
            cqs,
            mrs,
            stats,
            ..
        } = &mut self.verbs;
        let entry = qps.get_mut(qp.0).ok_or(INVALID_QP)?;
        let cq = cqs
            .get_mut(entry.recv_cq.0)
            .ok_or(FabricError::InvalidHandle {
                kind: "completion queue",
            })?;
        let Some(Memory::Owned(region)) = mrs.get_mut(mr.0).map(|m| &mut m.memory) else {
            return Err(FabricError::InvalidHandle {
                kind: "memory region",
            });
        };
        let overflow = self.gro_overflow.as_deref().unwrap_or(&[]);
        let mut primary = [None; sys::MAX_BATCH];
        for slot in primary.iter_mut().take(received) {
            *slot = entry.recv_queue.pop_front();
        }
        // Buffers whose datagram was dropped go back, at the front.
        // Only first datagrams are kept: a later one of a train is copied
        // into the front posted buffer, which leaves the queue only once the
        // datagram is accepted (a dropped one leaves it for the next).
        let mut kept = [None; sys::MAX_BATCH];
        let mut kept_count = 0;
        let mut queued = 0;
        for (i, meta) in self.scratch.meta[..received].iter().enumerate() {
            let Some(first) = primary[i] else {
                break;
            };
            let segments = if meta.stride > 0 && meta.len > meta.stride && !meta.truncated {
                meta.len.div_ceil(meta.stride)
            } else {
                1
            };
            for k in 0..segments {
                let extra = k > 0;
                let (wr, len, header) = if segments == 1 {
                    (first, meta.len, meta.header)
                } else {
                    let begin = k * meta.stride;
                    let len = meta.stride.min(meta.len - begin);
                    let wr = if k == 0 {
                        first
                    } else {
                        match entry.recv_queue.front().copied() {
                            Some(wr)
                                if wr.sge.lkey == first.sge.lkey
                                    && wr.sge.len >= SKIP + len
                                    && cq.room() > 0 =>
                            {
                                copy_segment(region, overflow, first.sge, i, begin, len, wr.sge);
                                wr
                            }
                            _ => {
                                stats.rx_no_buffer += (segments - k) as u64;
                                break;
                            }
                        }
                    };
                    // A datagram shorter than the header (junk) copies
                    // what it has; parse_header then refuses it.
                    let at = wr.sge.offset + SKIP;
                    let have = ud::HEADER_LEN.min(len);
                    let mut header = [0; ud::HEADER_LEN];
                    header[..have].copy_from_slice(&region[at..at + have]);
                    (wr, len, header)
                };
                let Some(repr) = parse_header(&header, len) else {
                    stats.rx_malformed += 1;
                    if !extra {
                        kept[kept_count] = Some(wr);
                        kept_count += 1;
                    }
                    continue;
                };
                if !entry.admit(repr.pkey, repr.qkey, stats) {
                    if !extra {
                        kept[kept_count] = Some(wr);
                        kept_count += 1;
                    }
                    continue;
                }
                if extra {
                    entry.recv_queue.pop_front();
                }
                let payload = len - ud::HEADER_LEN;
                let (status, byte_len) = if meta.truncated {
                    stats.rx_too_long += 1;
                    (WcStatus::LocalLengthError, 0)
                } else {
                    stats.rx_datagrams += 1;
                    stats.rx_bytes += payload as u64;
                    (WcStatus::Success, (GRH_LEN + payload) as u32)
                };
                let src = meta.source.map(|s| QpAddr {
                    node: NodeAddr::Ip(s.ip()),
                    qpn: u32::from(s.port()),
                });
                let wc = WorkCompletion {
                    wr_id: wr.wr_id,
                    status,
                    opcode: WcOpcode::Recv,
                    byte_len,
                    qp_num: entry.qp_num,
                    src,
                    imm: repr.imm,
                };
                cq.push(wc, qp);
                queued += 1;
            }
            if segments > 1 {
                stats.rx_gro_trains += 1;
            }
        }
        for wr in kept[..kept_count].iter().rev().flatten() {
            entry.recv_queue.push_front(*wr);
        }
        Ok(queued)
    }

    /// Reads and discards what arrived for a queue pair with no receive
    /// posted, as UD drops such datagrams: each is counted as dropped for
    /// want of a buffer, or as malformed when it is garbage.
    ///
    /// Datagrams are read one at a time into the whole scratch buffer, so
    /// that each, or each datagram of a GRO train, is judged by its own
    /// header. This path is not a fast one: it serves queue pairs that
    /// only send, whose sockets nobody should write to.
    fn discard_unbuffered(&mut self, qp: QpHandle) -> Result<()> {
        const SKIP: usize = GRH_LEN - ud::HEADER_LEN;
        let transport = &self.verbs.qp(qp)?.transport;
        let (socket, gro) = (&transport.socket, transport.gro);
        let target = [(0, self.drop_scratch.len())];
        let meta = &mut self.scratch.meta[..1];
        let (mut dropped, mut malformed) = (0, 0);
        for _ in 0..DISCARD_MAX {
            let n = sys::recv_batch(
                socket.as_fd(),
                &mut self.drop_scratch,
                &target,
                meta,
                gro,
                None,
            )
            .map_err(|source| FabricError::Io {
                operation: "recvmsg",
                source,
            })?;
            if n == 0 {
                break;
            }
            let (len, stride) = (meta[0].len, meta[0].stride);
            let stride = if stride > 0 && len > stride {
                stride
            } else {
                len.max(1)
            };
            for begin in (0..len.max(1)).step_by(stride) {
                let at = SKIP + begin;
                let have = ud::HEADER_LEN.min(len - begin);
                let mut header = [0; ud::HEADER_LEN];
                header[..have].copy_from_slice(&self.drop_scratch[at..at + have]);
                if parse_header(&header, len - begin).is_some() {
                    dropped += 1;
                } else {
                    malformed += 1;
                }
            }
        }
        self.verbs.stats.rx_no_buffer += dropped;
        self.verbs.stats.rx_malformed += malformed;
        Ok(())
    }

    /// Sends a run of accepted work requests, `chunk`, whose lengths are
    /// `lens`, as one `sendmmsg` batch, and completes them.
    ///
    /// `N` bounds the batch and `IOV` its gather entries (`N` times one header
    /// plus [`MAX_SEND_SGE`]); the caller picks small bounds for a single
    /// send, so the fast path prepares one message, not a full batch.
    fn transmit<const N: usize, const IOV: usize>(
        &mut self,
        qp: QpHandle,
        chunk: &[SendWr<'_>],
        lens: &[usize],
    ) -> Result<()> {
        let mut outcome = [Outcome::Sent; N];
        let trains = {
            let entry = self.verbs.qp(qp)?;
            let (qp_qkey, pkey) = (entry.qkey, entry.pkey);
            let mut headers = [[0u8; ud::HEADER_LEN]; N];
            let mut dests = [SocketAddr::from(([0, 0, 0, 0], 0)); N];
            for (i, wr) in chunk.iter().enumerate() {
                let qkey = if wr.remote_qkey & 0x8000_0000 != 0 {
                    qp_qkey
                } else {
                    wr.remote_qkey
                };
                headers[i] = ud::Repr {
                    pkey,
                    qkey,
                    imm: wr.imm,
                }
                .to_bytes();
                let ip = self.verbs.ah(wr.ah)?.route;
                dests[i] = SocketAddr::new(ip, wr.remote_qpn as u16);
            }
            let empty: &[u8] = &[];
            let mut iov = [IoSlice::new(empty); IOV];
            let mut spans = [(0usize, 0usize); N];
            let mut used = 0;
            for (i, wr) in chunk.iter().enumerate() {
                let start = used;
                iov[used] = IoSlice::new(&headers[i]);
                used += 1;
                for gather in wr.sg_list {
                    iov[used] = IoSlice::new(self.verbs.gather_bytes(gather));
                    used += 1;
                }
                spans[i] = (start, used);
            }
            // Group datagrams into messages: a GSO train is a run to one
            // destination where every datagram but the last has the same size.
            let mut msgs = [sys::OutMsg {
                dest: dests[0],
                iov: &[],
                segment_size: None,
            }; N];
            let mut members = [(0usize, 0usize); N];
            let mut msg_count = 0;
            let mut i = 0;
            while i < chunk.len() {
                let size = lens[i] + ud::HEADER_LEN;
                let mut end = i + 1;
                if self.gso {
                    let mut total = size;
                    while end < chunk.len()
                        && end - i < MAX_GSO_SEGMENTS
                        && dests[end] == dests[i]
                        && lens[end - 1] == lens[i]
                        && lens[end] <= lens[i]
                        && lens[end] > 0
                        && total + lens[end] + ud::HEADER_LEN <= MAX_UDP_PAYLOAD_V4
                    {
                        total += lens[end] + ud::HEADER_LEN;
                        end += 1;
                    }
                }
                msgs[msg_count] = sys::OutMsg {
                    dest: dests[i],
                    iov: &iov[spans[i].0..spans[end - 1].1],
                    segment_size: (end - i > 1).then_some(size as u16),
                };
                members[msg_count] = (i, end);
                msg_count += 1;
                i = end;
            }
            let socket = &entry.transport.socket;
            let mut next = 0;
            // Trains the kernel took as trains: a refused one went singly.
            let mut trains = 0;
            while next < msg_count {
                match sys::send_batch::<N>(socket.as_fd(), &msgs[next..msg_count]) {
                    Ok(0) => break,
                    Ok(sent) => {
                        trains += msgs[next..next + sent]
                            .iter()
                            .filter(|m| m.segment_size.is_some())
                            .count();
                        next += sent;
                    }
                    Err(err) => {
                        let (first, end) = members[next];
                        let verdict = classify_send_error(&err, msgs[next].segment_size.is_some());
                        if verdict == Outcome::GsoRefused {
                            // Resend this train one datagram at a time.
                            self.gso = false;
                            for j in first..end {
                                let single = sys::OutMsg {
                                    dest: dests[j],
                                    iov: &iov[spans[j].0..spans[j].1],
                                    segment_size: None,
                                };
                                outcome[j] = match sys::send_batch::<1>(socket.as_fd(), &[single]) {
                                    Ok(_) => Outcome::Sent,
                                    Err(err) => classify_send_error(&err, false),
                                };
                            }
                            tracing::warn!(%err, "UDP GSO refused by the kernel; sending datagrams singly");
                        } else {
                            tracing::trace!(%err, "datagram refused by the kernel");
                            outcome[first..end].fill(verdict);
                        }
                        next += 1;
                    }
                }
            }
            trains
        };
        self.verbs.stats.tx_gso_trains += trains as u64;
        for (i, wr) in chunk.iter().enumerate() {
            match outcome[i] {
                Outcome::Sent => {}
                Outcome::Lost => self.verbs.stats.tx_kernel_drops += 1,
                Outcome::Failed | Outcome::GsoRefused => {
                    self.complete_failed_send(qp, wr);
                    continue;
                }
            }
            self.verbs.complete_send(qp, wr, lens[i]);
        }
        Ok(())
    }

    fn complete_failed_send(&mut self, qp: QpHandle, wr: &SendWr<'_>) {
        if !wr.flags.contains(crate::SendFlags::SIGNALED) {
            return;
        }
        let Ok(entry) = self.verbs.qp_mut(qp) else {
            return;
        };
        entry.sends_outstanding += 1;
        let (cq, qp_num) = (entry.send_cq, entry.qp_num);
        self.verbs.push_completion(
            cq,
            qp,
            WorkCompletion {
                wr_id: wr.wr_id,
                status: WcStatus::GeneralError,
                opcode: WcOpcode::Send,
                byte_len: 0,
                qp_num,
                src: None,
                imm: None,
            },
        );
    }
}

/// The verbs checks of a send, plus this provider's own: the remote QP
/// number is a UDP port.
fn check_udp_send(
    verbs: &Verbs<UdpQp, IpAddr>,
    entry: &QpEntry<UdpQp>,
    wr: &SendWr<'_>,
) -> Result<usize> {
    let len = verbs.check_send(entry, wr)?;
    if wr.remote_qpn == 0 || wr.remote_qpn > u32::from(u16::MAX) {
        return Err(FabricError::InvalidArgument {
            what: "remote queue pair number",
            detail: format!("{} is not a UDP port", wr.remote_qpn),
        });
    }
    Ok(len)
}

/// Copies datagram bytes `begin..begin + len` of the train received into the
/// buffer `from` (continued in batch slot `slot` of `overflow`) to the
/// buffer `to`, where a datagram lands as `recv_batch` places it.
fn copy_segment(
    region: &mut [u8],
    overflow: &[u8],
    from: Sge,
    slot: usize,
    begin: usize,
    len: usize,
    to: Sge,
) {
    const SKIP: usize = GRH_LEN - ud::HEADER_LEN;
    let in_place = from.len - SKIP;
    let dest = to.offset + SKIP;
    // The part still inside the first buffer, then the part that spilled.
    let head = in_place.saturating_sub(begin).min(len);
    if head > 0 {
        let src = from.offset + SKIP + begin;
        region.copy_within(src..src + head, dest);
    }
    if head < len {
        let spilled = slot * sys::GRO_OVERFLOW + (begin + head - in_place);
        region[dest + head..dest + len].copy_from_slice(&overflow[spilled..spilled + len - head]);
    }
}

/// The encapsulation header of a received datagram, if it has a valid one.
fn parse_header(header: &[u8; ud::HEADER_LEN], len: usize) -> Option<ud::Repr> {
    let header = header.get(..len.min(ud::HEADER_LEN))?;
    ud::Packet::new_checked(header)
        .and_then(|p| ud::Repr::parse(&p))
        .ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Sent,
    /// Dropped by the kernel: to the peer it is a lost datagram.
    Lost,
    /// The kernel refused a GSO train; resend singly.
    GsoRefused,
    /// A local failure that is not a loss.
    Failed,
}

fn classify_send_error(err: &io::Error, gso: bool) -> Outcome {
    match err.raw_os_error() {
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT) if gso => Outcome::GsoRefused,
        Some(
            libc::EAGAIN
            | libc::ENOBUFS
            | libc::ENOMEM
            | libc::EPERM
            | libc::EACCES
            | libc::ECONNREFUSED
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::ENETDOWN
            | libc::EHOSTDOWN
            | libc::EMSGSIZE,
        ) => Outcome::Lost,
        _ => Outcome::Failed,
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
        check_udp_send(&self.verbs, self.verbs.qp(qp)?, wr)
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
        let gro = self.gro && self.enable_gro(&socket);
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
        self.verbs.insert_qp(
            pd,
            attr,
            cap,
            u32::from(port),
            UdpQp {
                socket,
                receives: false,
                batch_hint: 1,
                busy_polls: 0,
                gro,
            },
        )
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<()> {
        let recv_cq = self.verbs.qp(qp)?.recv_cq;
        let transport = self.verbs.remove_qp(qp)?;
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
        self.verbs.post_recv(qp, wrs)?;
        if let Ok(entry) = self.verbs.qp_mut(qp) {
            entry.transport.receives = true;
        }
        Ok(())
    }

    fn post_send(&mut self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let mut posted = 0;
        while posted < wrs.len() {
            let mut lens = [0usize; sys::MAX_BATCH];
            let mut accepted = 0;
            let mut refusal = None;
            {
                let entry = self
                    .verbs
                    .qp(qp)
                    .map_err(|error| PostError { posted, error })?;
                for wr in wrs[posted..].iter().take(sys::MAX_BATCH) {
                    let checked = check_udp_send(&self.verbs, entry, wr);
                    match checked {
                        Ok(len) => {
                            lens[accepted] = len;
                            accepted += 1;
                        }
                        Err(error) => {
                            refusal = Some(error);
                            break;
                        }
                    }
                }
                // Signaled sends of this batch must fit the send queue and
                // completion queue together, not only one by one.
                let signaled = wrs[posted..posted + accepted]
                    .iter()
                    .filter(|wr| wr.flags.contains(crate::SendFlags::SIGNALED))
                    .count();
                let sq_room = (entry.cap.max_send_wr
                    - entry.sends_outstanding.min(entry.cap.max_send_wr))
                    as usize;
                let room = sq_room.min(self.verbs.cq_room(entry.send_cq));
                if signaled > room {
                    let mut seen = 0;
                    let cut = wrs[posted..posted + accepted]
                        .iter()
                        .position(|wr| {
                            seen += usize::from(wr.flags.contains(crate::SendFlags::SIGNALED));
                            seen > room
                        })
                        .unwrap_or(accepted);
                    accepted = cut;
                    refusal = Some(FabricError::QueueFull {
                        queue: if sq_room <= room {
                            "send queue"
                        } else {
                            "completion queue"
                        },
                        capacity: entry.cap.max_send_wr as usize,
                    });
                }
            }
            if accepted > 0 {
                const SINGLE_IOV: usize = 1 + MAX_SEND_SGE as usize;
                const BATCH_IOV: usize = sys::MAX_BATCH * SINGLE_IOV;
                let chunk = &wrs[posted..posted + accepted];
                if accepted == 1 {
                    self.transmit::<1, SINGLE_IOV>(qp, chunk, &lens[..1])
                } else {
                    self.transmit::<{ sys::MAX_BATCH }, BATCH_IOV>(qp, chunk, &lens[..accepted])
                }
                .map_err(|error| PostError { posted, error })?;
                posted += accepted;
            }
            if let Some(error) = refusal {
                return Err(PostError { posted, error });
            }
        }
        Ok(())
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
            self.receive(cq, out.len() - queued)?;
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
