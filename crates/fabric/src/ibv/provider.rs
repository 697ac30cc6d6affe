//! The `verbs` provider's safe layer: [`Provider`] and [`Context`] over the
//! objects of [`sys`](super::sys).
//!
//! The shared bookkeeping ([`Verbs`]) checks every call exactly as it does
//! for `udp` and `sim` (handles, states, keys, bounds, queue room), and
//! holds the caller-visible memory registrations. The hardware holds only
//! what the provider posts: each queue pair's receive and send staging
//! slots, registered with `IBV_ACCESS_LOCAL_WRITE`.
//!
//! * A receive is posted into a free staging slot of its queue pair, with
//!   the caller buffer's length (capped at the slot), so the device writes
//!   the 40-byte GRH and then the payload there and reports an overlong
//!   datagram itself. When the completion is polled, inside
//!   [`Context::poll_cq`], the filled bytes (GRH included) are copied to the
//!   caller's buffer at the same offsets: the layout of [`GRH_LEN`].
//! * A send is copied into a free send slot when posted (inline when it
//!   fits the granted inline limit), so the caller's bytes are consumed
//!   when `post_send` returns, as the fabric contract says. Every send is
//!   signaled to the device; completions the caller did not ask for are
//!   consumed inside `poll_cq` and only free their slot.
//!
//! The copy keeps the fabric contract sound on hardware that writes memory
//! asynchronously: the caller's registrations are never reachable by the
//! device.

use std::collections::HashMap;
use std::time::Duration;

use super::logic::{
    self, AhSpec, Gid, LinkLayer, LocalPort, Mtu, RecvLayout, SlotPool, Verb, WC_FLAG_GRH,
};
use super::sys::{self, Completion, QpCapRaw, SendReq, UdQp};
use crate::bookkeeping::{Memory, Verbs};
use crate::{
    AhAttr, AhHandle, CompletionChannel, Context, CqHandle, DeviceAttr, DeviceInfo, FabricError,
    FabricStats, GRH_LEN, Mr, MrHandle, NodeAddr, PdHandle, PortAttr, PortState, PostError,
    Provider, QpAddr, QpHandle, QpInfo, QpInitAttr, QpState, QpTransition, RecvWr, ResourceCounts,
    Result, SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

/// The provider's name.
pub const NAME: &str = "verbs";

/// Most GID table entries read per port.
const MAX_GIDS: u16 = 256;
/// Most partition key table entries read per port.
const MAX_PKEYS: u16 = 128;
/// Most completions moved from the device per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;
/// Most sends handed to the device per `ibv_post_send` call.
const SEND_BATCH: usize = 32;
/// Inline bytes the provider asks a queue pair for at most.
const MAX_INLINE: u32 = 256;
/// Asynchronous events are read every this many polls.
const EVENT_INTERVAL: u32 = 64;

/// `enum ibv_event_type` values the provider acts on.
mod event {
    pub(super) const CQ_ERR: u32 = 0;
    pub(super) const QP_FATAL: u32 = 1;
    pub(super) const DEVICE_FATAL: u32 = 8;
    pub(super) const PORT_ACTIVE: u32 = 9;
    pub(super) const PORT_ERR: u32 = 10;
}
/// `IBV_PORT_ACTIVE`.
const IBV_PORT_ACTIVE: u32 = 4;

/// Configuration of the `verbs` provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerbsConfig {
    /// GID index to send from; `None` chooses as
    /// [`select_gid_index`](super::select_gid_index) does.
    pub gid_index: Option<u8>,
    /// Cap on the payload of one datagram (bytes); `None` uses the port's
    /// active MTU.
    pub mtu: Option<usize>,
}

/// The `verbs` provider: UD queue pairs on RDMA devices through libibverbs.
#[derive(Debug, Clone, Default)]
pub struct VerbsProvider {
    config: VerbsConfig,
}

impl VerbsProvider {
    /// A provider with the given configuration.
    pub const fn new(config: VerbsConfig) -> Self {
        Self { config }
    }

    /// The configuration.
    pub const fn config(&self) -> &VerbsConfig {
        &self.config
    }

    fn port_attr(&self, device: &sys::Device, name: &str, port: u8) -> Result<PortInfo> {
        let err = |errno| logic::errno_error(Verb::Query, errno, name);
        let raw = device.query_port(port).map_err(err)?;
        let link_layer = LinkLayer::from_ibv(raw.link_layer).unwrap_or(LinkLayer::InfiniBand);
        let gid_count = u16::try_from(raw.gid_tbl_len.max(0))
            .unwrap_or(MAX_GIDS)
            .min(MAX_GIDS);
        let gids: Vec<Gid> = (0..gid_count)
            .map(|i| device.query_gid(port, i).map(Gid).unwrap_or(Gid::ZERO))
            .collect();
        let pkeys: Vec<u16> = (0..raw.pkey_tbl_len.min(MAX_PKEYS))
            .map(|i| device.query_pkey(port, i).unwrap_or(0))
            .collect();
        let gid_index = logic::select_gid_index(&gids, link_layer, self.config.gid_index);
        let (gid_index, gid) = match gid_index {
            Ok(i) => (i, gids.get(usize::from(i)).copied().unwrap_or(Gid::ZERO)),
            // A port with no usable GID can still be listed; it is down.
            Err(_) => (0, Gid::ZERO),
        };
        let mtu = Mtu::from_ibv(raw.active_mtu).unwrap_or(Mtu::Mtu256);
        let max_msg_size = match self.config.mtu {
            Some(cap) if cap > 0 => cap.min(mtu.bytes()),
            _ => mtu.bytes(),
        };
        let usable = raw.state == IBV_PORT_ACTIVE
            && match link_layer {
                LinkLayer::InfiniBand => raw.lid != 0,
                LinkLayer::Ethernet => !gid.is_zero(),
            };
        Ok(PortInfo {
            attr: PortAttr {
                port_num: port,
                state: if usable {
                    PortState::Active
                } else {
                    PortState::Down
                },
                addr: NodeAddr::Ib {
                    lid: raw.lid,
                    gid: gid.raw(),
                },
                max_msg_size,
                network: logic::network_id(link_layer, gid),
                pkeys: if pkeys.is_empty() {
                    vec![0xffff]
                } else {
                    pkeys
                },
                link_layer: link_layer.name(),
            },
            local: LocalPort {
                port,
                link_layer,
                gid,
                gid_index,
            },
            mtu,
            gids,
        })
    }

    /// The ports of `name`, as [`Context::query_port`] would report them,
    /// with verbs details for listings (`udinfo`).
    ///
    /// # Errors
    /// [`FabricError::NoSuchDevice`], or a failed query.
    pub fn describe(&self, name: &str) -> Result<Vec<PortDetail>> {
        let (device, info) = self.open_raw(name)?;
        (1..=info.port_count)
            .map(|port| {
                let p = self.port_attr(&device, name, port)?;
                Ok(PortDetail {
                    attr: p.attr,
                    link_layer: p.local.link_layer,
                    active_mtu: p.mtu,
                    gid_index: p.local.gid_index,
                    gids: p.gids.into_iter().filter(|g| !g.is_zero()).collect(),
                })
            })
            .collect()
    }

    fn open_raw(&self, name: &str) -> Result<(sys::Device, DeviceInfo)> {
        let list = match sys::DeviceList::new() {
            Ok(list) => list,
            // No RDMA support in the kernel: no device of any name.
            Err(libc::ENOSYS | libc::ENODEV | libc::ENOENT) => {
                return Err(FabricError::NoSuchDevice {
                    provider: NAME,
                    name: name.into(),
                });
            }
            Err(errno) => return Err(list_error(errno)),
        };
        let device = list
            .open(name)
            .map_err(|errno| logic::errno_error(Verb::OpenDevice, errno, name))?
            .ok_or_else(|| FabricError::NoSuchDevice {
                provider: NAME,
                name: name.into(),
            })?;
        let raw = device
            .query_device()
            .map_err(|errno| logic::errno_error(Verb::Query, errno, name))?;
        let info = DeviceInfo {
            name: name.into(),
            provider: NAME,
            port_count: u8::try_from(raw.phys_port_cnt).unwrap_or(u8::MAX),
            attr: DeviceAttr {
                max_qp: raw.max_qp,
                max_qp_wr: raw.max_qp_wr,
                max_sge: raw.max_sge,
                max_cq: raw.max_cq,
                max_cqe: raw.max_cqe,
                max_mr: raw.max_mr,
                max_ah: raw.max_ah,
                max_inline_data: MAX_INLINE,
            },
        };
        Ok((device, info))
    }
}

/// What a listing shows of one port.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortDetail {
    /// As [`Context::query_port`] reports it.
    pub attr: PortAttr,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// The GID index the provider sends from.
    pub gid_index: u8,
    /// The port's non-empty GIDs.
    pub gids: Vec<Gid>,
}

fn list_error(errno: sys::Errno) -> FabricError {
    FabricError::Io {
        operation: "ibv_get_device_list",
        source: std::io::Error::from_raw_os_error(errno),
    }
}

#[derive(Debug, Clone)]
struct PortInfo {
    attr: PortAttr,
    local: LocalPort,
    mtu: Mtu,
    gids: Vec<Gid>,
}

impl Provider for VerbsProvider {
    type Context = VerbsContext;

    fn name(&self) -> &'static str {
        NAME
    }

    /// Every device libibverbs lists that opens and answers
    /// `ibv_query_device`; an empty list when there are none (or the
    /// kernel has no RDMA support: `ENOSYS`).
    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let list = match sys::DeviceList::new() {
            Ok(list) => list,
            Err(libc::ENOSYS | libc::ENODEV | libc::ENOENT) => return Ok(Vec::new()),
            Err(errno) => return Err(list_error(errno)),
        };
        let names = list.names();
        drop(list);
        Ok(names
            .iter()
            .filter_map(|name| match self.open_raw(name) {
                Ok((_, info)) => Some(info),
                Err(err) => {
                    tracing::warn!(device = %name, %err, "skipping an RDMA device that does not open");
                    None
                }
            })
            .collect())
    }

    fn open(&self, name: &str) -> Result<VerbsContext> {
        let (device, info) = self.open_raw(name)?;
        let ports: Vec<PortInfo> = (1..=info.port_count)
            .map(|port| self.port_attr(&device, name, port))
            .collect::<Result<_>>()?;
        let max_payload = ports
            .iter()
            .map(|p| p.attr.max_msg_size)
            .max()
            .unwrap_or(Mtu::Mtu256.bytes());
        let attrs = ports.iter().map(|p| p.attr.clone()).collect();
        Ok(VerbsContext {
            verbs: Verbs::new(info, attrs),
            locals: ports.iter().map(|p| p.local).collect(),
            max_payload,
            pds: HashMap::new(),
            cqs: HashMap::new(),
            qps: HashMap::new(),
            qp_nums: HashMap::new(),
            peers_by_lid: HashMap::new(),
            lids_by_gid: HashMap::new(),
            polls: 0,
            fatal: None,
            scratch: vec![Completion::default(); POLL_BATCH],
            device,
        })
    }
}

/// A queue pair's hardware half.
#[derive(Debug)]
struct HwQp {
    hw: UdQp,
    recv_layout: RecvLayout,
    recv_slots: SlotPool,
    /// The caller's receive posted in each staging slot.
    recv_wrs: Vec<Option<RecvWr>>,
    /// `(wr_id, signaled)` of the send in each staging slot.
    sends: Vec<Option<(u64, bool)>>,
    send_cq: CqHandle,
    recv_cq: CqHandle,
}

#[derive(Debug)]
struct HwCq {
    cq: sys::Cq,
    /// Work requests that queue pairs on this queue may have posted at once:
    /// the device's queue is kept at least this large, so it cannot overrun.
    attached_wrs: u32,
}

/// An opened RDMA device.
///
/// Fields drop in declaration order: hardware queue pairs first, then
/// queues, domains, and the device last (each child also holds its
/// parent).
#[derive(Debug)]
pub struct VerbsContext {
    verbs: Verbs<(), sys::Ah>,
    qps: HashMap<QpHandle, HwQp>,
    cqs: HashMap<CqHandle, HwCq>,
    pds: HashMap<PdHandle, sys::Pd>,
    locals: Vec<LocalPort>,
    max_payload: usize,
    qp_nums: HashMap<u32, QpHandle>,
    /// GIDs of remote ports by LID, learned from the address handles made:
    /// a LID-routed receive carries no GRH, but the peer's published
    /// address has its GID.
    peers_by_lid: HashMap<u16, [u8; 16]>,
    /// LIDs of remote ports by GID, for receives that carry a GRH.
    lids_by_gid: HashMap<[u8; 16], u16>,
    polls: u32,
    /// Set by a fatal asynchronous event; every later poll fails with it.
    fatal: Option<String>,
    scratch: Vec<Completion>,
    device: sys::Device,
}

fn invalid(kind: &'static str) -> FabricError {
    FabricError::InvalidHandle { kind }
}

impl VerbsContext {
    fn errno(&self, verb: Verb, errno: sys::Errno) -> FabricError {
        logic::errno_error(verb, errno, &self.verbs.device.name)
    }

    /// The full address of a queue pair, as peers address it.
    ///
    /// # Errors
    /// Bad handle, or a queue pair not bound to a port yet.
    pub fn qp_addr(&self, qp: QpHandle) -> Result<QpAddr> {
        let entry = self.verbs.qp(qp)?;
        let port = self.verbs.port(entry.port.max(1))?;
        Ok(QpAddr {
            node: port.addr,
            qpn: entry.qp_num,
        })
    }

    /// Reads and acts on pending asynchronous events: port up and down
    /// change the port's state, a fatal device or completion queue error
    /// makes every later poll fail.
    fn handle_async_events(&mut self) {
        loop {
            let event = match self.device.next_async_event() {
                Ok(Some(event)) => event,
                Ok(None) => return,
                Err(errno) => {
                    tracing::warn!(errno, "reading asynchronous events failed");
                    return;
                }
            };
            let name = sys::event_name(event.kind);
            let port = self
                .verbs
                .ports
                .iter_mut()
                .find(|p| p.port_num == event.port);
            match (event.kind, port) {
                (event::PORT_ACTIVE, Some(port)) => {
                    tracing::info!(port = port.port_num, "RDMA port up");
                    port.state = PortState::Active;
                }
                (event::PORT_ERR, Some(port)) => {
                    tracing::warn!(port = port.port_num, "RDMA port down");
                    port.state = PortState::Down;
                }
                (event::DEVICE_FATAL | event::CQ_ERR, _) => {
                    tracing::error!(event = %name, "fatal RDMA device event");
                    self.fatal = Some(name);
                }
                (event::QP_FATAL, _) => tracing::error!(event = %name, "RDMA queue pair failed"),
                _ => tracing::debug!(event = %name, port = event.port, "RDMA async event"),
            }
        }
    }

    /// The source address of a receive completion.
    fn source_of(&self, wc: &Completion, grh: Option<&[u8; GRH_LEN]>) -> QpAddr {
        let (lid, gid) = match grh.map(|g| logic::grh_source_gid(g).raw()) {
            Some(gid) => (
                self.lids_by_gid.get(&gid).copied().unwrap_or(wc.slid()),
                gid,
            ),
            None => (
                wc.slid(),
                self.peers_by_lid
                    .get(&wc.slid())
                    .copied()
                    .unwrap_or_default(),
            ),
        };
        QpAddr {
            node: NodeAddr::Ib { lid, gid },
            qpn: wc.src_qp(),
        }
    }

    /// Moves up to `room` device completions of `cq` into its software
    /// queue (completions the caller did not ask for take no room).
    fn reap(&mut self, cq: CqHandle, room: usize) -> Result<()> {
        let mut room = room;
        while room > 0 {
            let want = room.min(POLL_BATCH);
            let hw = &self
                .cqs
                .get(&cq)
                .ok_or_else(|| invalid("completion queue"))?
                .cq;
            let got = hw
                .poll(&mut self.scratch[..want])
                .map_err(|errno| self.errno(Verb::PollCq, errno))?;
            for i in 0..got {
                let wc = self.scratch[i];
                if self.complete(&wc) {
                    room -= 1;
                }
            }
            if got < want {
                break;
            }
        }
        Ok(())
    }

    /// Handles one device completion; `true` if it queued a caller
    /// completion.
    fn complete(&mut self, wc: &Completion) -> bool {
        let Some(&qp) = self.qp_nums.get(&wc.qp_num()) else {
            // A queue pair destroyed since: nothing is owed to anyone.
            return false;
        };
        let status = logic::wc_status(wc.status());
        if status != WcStatus::Success && status != WcStatus::WrFlushError {
            tracing::debug!(
                status = wc.status(),
                vendor_err = wc.vendor_err(),
                "RDMA completion error"
            );
        }
        if wc.is_recv() {
            self.complete_recv(qp, wc, status)
        } else {
            self.complete_send(qp, wc, status)
        }
    }

    fn complete_recv(&mut self, qp: QpHandle, wc: &Completion, status: WcStatus) -> bool {
        let Some(hw) = self.qps.get_mut(&qp) else {
            return false;
        };
        let Some((slot, bytes)) = hw.hw.take_recv(wc) else {
            return false;
        };
        let wr = hw.recv_wrs.get_mut(slot as usize).and_then(Option::take);
        hw.recv_slots.give(slot);
        let Some(wr) = wr else {
            return false;
        };
        // The GRH, copied out now: `source_of` borrows all of `self`.
        let grh = (wc.wc_flags() & WC_FLAG_GRH != 0)
            .then(|| {
                bytes
                    .get(..GRH_LEN)
                    .and_then(|g| <[u8; GRH_LEN]>::try_from(g).ok())
            })
            .flatten();
        let byte_len = bytes.len();
        // Copy what the device wrote (GRH, then payload) into the caller's
        // buffer at the same offsets.
        let copied = {
            let Verbs { mrs, .. } = &mut self.verbs;
            let target = mrs
                .handle_at(wr.sge.lkey.0 & 0xffff)
                .and_then(|h| mrs.get_mut(h))
                .and_then(|mr| match &mut mr.memory {
                    Memory::Owned(region) => {
                        region.get_mut(wr.sge.offset..wr.sge.offset + byte_len)
                    }
                    Memory::User { .. } => None,
                });
            match target {
                Some(dst) if byte_len <= wr.sge.len => {
                    dst.copy_from_slice(bytes);
                    true
                }
                _ => false,
            }
        };
        let status = match status {
            WcStatus::Success if !copied => WcStatus::LocalProtectionError,
            other => other,
        };
        if let Ok(entry) = self.verbs.qp_mut(qp) {
            if let Some(at) = entry.recv_queue.iter().position(|r| *r == wr) {
                entry.recv_queue.remove(at);
            }
        }
        let src = (status == WcStatus::Success).then(|| self.source_of(wc, grh.as_ref()));
        let stats = &mut self.verbs.stats;
        match status {
            WcStatus::Success => {
                stats.rx_datagrams += 1;
                stats.rx_bytes += byte_len.saturating_sub(GRH_LEN) as u64;
            }
            WcStatus::LocalLengthError => stats.rx_too_long += 1,
            _ => {}
        }
        let Ok(entry) = self.verbs.qp(qp) else {
            return false;
        };
        let (cq, qp_num) = (entry.recv_cq, entry.qp_num);
        let with_imm = wc.wc_flags() & logic::WC_FLAG_WITH_IMM != 0;
        self.verbs.push_completion(
            cq,
            qp,
            WorkCompletion {
                wr_id: wr.wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: if status == WcStatus::Success {
                    u32::try_from(byte_len).unwrap_or(u32::MAX)
                } else {
                    0
                },
                qp_num,
                src,
                imm: with_imm.then(|| wc.imm()),
            },
        );
        true
    }

    fn complete_send(&mut self, qp: QpHandle, wc: &Completion, status: WcStatus) -> bool {
        let Some(hw) = self.qps.get_mut(&qp) else {
            return false;
        };
        let Some(slot) = hw.hw.take_send(wc) else {
            return false;
        };
        let Some((wr_id, signaled)) = hw.sends.get_mut(slot as usize).and_then(Option::take) else {
            return false;
        };
        if !signaled {
            if status != WcStatus::Success {
                tracing::debug!(wr_id, ?status, "unsignaled RDMA send failed");
            }
            return false;
        }
        let Ok(entry) = self.verbs.qp(qp) else {
            return false;
        };
        let (cq, qp_num) = (entry.send_cq, entry.qp_num);
        self.verbs.push_completion(
            cq,
            qp,
            WorkCompletion {
                wr_id,
                status,
                opcode: WcOpcode::Send,
                byte_len: 0,
                qp_num,
                src: None,
                imm: None,
            },
        );
        true
    }

    /// Posts one batch of at most [`SEND_BATCH`] sends; returns how many
    /// were accepted, or the refusal with that count.
    fn post_send_batch(
        &mut self,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
    ) -> Result<usize, (usize, FabricError)> {
        let Self { verbs, qps, .. } = self;
        let hw = qps.get_mut(&qp).ok_or((0, invalid("queue pair")))?;
        let entry = verbs.qp(qp).map_err(|e| (0, e))?;
        let max_inline = hw.hw.cap().max_inline_data as usize;
        let mut gathers: Vec<Vec<&[u8]>> = Vec::with_capacity(wrs.len());
        let mut lens = Vec::with_capacity(wrs.len());
        let mut refusal = None;
        let mut signaled = 0u32;
        let cq_room = verbs.cq_room(entry.send_cq);
        for (i, wr) in wrs.iter().enumerate() {
            let checked = verbs.check_send(entry, wr).and_then(|len| {
                if wr.flags.contains(SendFlags::SIGNALED) {
                    let outstanding = entry.sends_outstanding + signaled;
                    if outstanding >= entry.cap.max_send_wr || signaled as usize >= cq_room {
                        return Err(FabricError::QueueFull {
                            queue: if outstanding >= entry.cap.max_send_wr {
                                "send queue"
                            } else {
                                "completion queue"
                            },
                            capacity: entry.cap.max_send_wr as usize,
                        });
                    }
                }
                if i >= hw.hw.send_room() {
                    return Err(FabricError::QueueFull {
                        queue: "send queue",
                        capacity: entry.cap.max_send_wr as usize,
                    });
                }
                Ok(len)
            });
            match checked {
                Ok(len) => {
                    signaled += u32::from(wr.flags.contains(SendFlags::SIGNALED));
                    gathers.push(wr.sg_list.iter().map(|g| verbs.gather_bytes(g)).collect());
                    lens.push(len);
                }
                Err(error) => {
                    refusal = Some((i, error));
                    break;
                }
            }
        }
        let mut reqs = Vec::with_capacity(gathers.len());
        for (wr, gather) in wrs.iter().zip(&gathers) {
            let ah = &verbs.ah(wr.ah).map_err(|e| (reqs.len(), e))?.route;
            reqs.push(SendReq {
                gather,
                ah,
                remote_qpn: wr.remote_qpn,
                remote_qkey: wr.remote_qkey,
                imm: wr.imm,
                inline: wr.len() <= max_inline,
                solicited: wr.flags.contains(SendFlags::SOLICITED),
            });
        }
        let mut slots = [0u32; SEND_BATCH];
        let posted = match hw.hw.post_send(&reqs, &mut slots) {
            Ok(()) => reqs.len(),
            Err((posted, errno)) => {
                let capacity = entry.cap.max_send_wr as usize;
                let error =
                    logic::post_errno_error(errno, "send queue", capacity, &verbs.device.name);
                refusal = Some((posted, error));
                posted
            }
        };
        drop(reqs);
        for (i, wr) in wrs[..posted].iter().enumerate() {
            let signaled = wr.flags.contains(SendFlags::SIGNALED);
            if let Some(info) = hw.sends.get_mut(slots[i] as usize) {
                *info = Some((wr.wr_id, signaled));
            }
        }
        let sent: u32 = wrs[..posted]
            .iter()
            .map(|wr| u32::from(wr.flags.contains(SendFlags::SIGNALED)))
            .sum();
        if let Ok(entry) = verbs.qp_mut(qp) {
            entry.sends_outstanding += sent;
        }
        verbs.stats.tx_datagrams += posted as u64;
        verbs.stats.tx_bytes += lens[..posted].iter().sum::<usize>() as u64;
        match refusal {
            Some((at, error)) => Err((at.min(posted), error)),
            None => Ok(posted),
        }
    }
}

/// The host's monotonic clock from a process-wide epoch.
fn monotonic_since_epoch() -> Duration {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed()
}

impl Context for VerbsContext {
    fn device(&self) -> &DeviceInfo {
        &self.verbs.device
    }

    /// The port as opened, with its state and LID read again from the
    /// device.
    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = self.verbs.port(port)?.clone();
        if let Ok(raw) = self.device.query_port(port) {
            if raw.state != IBV_PORT_ACTIVE {
                attr.state = PortState::Down;
            }
        }
        Ok(attr)
    }

    fn alloc_pd(&mut self) -> Result<PdHandle> {
        let hw = self
            .device
            .alloc_pd()
            .map_err(|errno| self.errno(Verb::AllocPd, errno))?;
        let pd = self.verbs.alloc_pd();
        self.pds.insert(pd, hw);
        Ok(pd)
    }

    fn dealloc_pd(&mut self, pd: PdHandle) -> Result<()> {
        self.verbs.dealloc_pd(pd)?;
        self.pds.remove(&pd);
        Ok(())
    }

    fn reg_mr(&mut self, pd: PdHandle, len: usize) -> Result<Mr> {
        self.verbs.reg_mr(pd, len)
    }

    fn reg_user_mr(&mut self, pd: PdHandle, region: &[u8]) -> Result<Mr> {
        self.verbs.reg_user_mr(pd, region)
    }

    fn dereg_mr(&mut self, mr: MrHandle) -> Result<()> {
        self.verbs.dereg_mr(mr)
    }

    fn mr_bytes(&self, mr: MrHandle) -> Result<&[u8]> {
        self.verbs.mr_bytes(mr)
    }

    fn mr_bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8]> {
        self.verbs.mr_bytes_mut(mr)
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqHandle> {
        let cq = self.verbs.create_cq(depth)?;
        match self.device.create_cq(depth) {
            Ok(hw) => {
                self.cqs.insert(
                    cq,
                    HwCq {
                        cq: hw,
                        attached_wrs: 0,
                    },
                );
                Ok(cq)
            }
            Err(errno) => {
                let _ = self.verbs.destroy_cq(cq);
                Err(self.errno(Verb::CreateCq, errno))
            }
        }
    }

    fn destroy_cq(&mut self, cq: CqHandle) -> Result<()> {
        self.verbs.destroy_cq(cq)?;
        self.cqs.remove(&cq);
        Ok(())
    }

    fn create_qp(&mut self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpInfo> {
        let cap = self.verbs.check_qp_init(pd, attr)?;
        let hw_pd = self
            .pds
            .get(&pd)
            .ok_or_else(|| invalid("protection domain"))?;
        let hw_cq = |cq: CqHandle| {
            self.cqs
                .get(&cq)
                .map(|c| c.cq.clone())
                .ok_or_else(|| invalid("completion queue"))
        };
        let (send_cq, recv_cq) = (hw_cq(attr.send_cq)?, hw_cq(attr.recv_cq)?);
        let request = QpCapRaw {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cap.max_inline_data,
        };
        let layout = RecvLayout::new(0, self.max_payload);
        let create = |request| {
            hw_pd.create_ud_qp(
                &send_cq,
                &recv_cq,
                request,
                layout.slot_len,
                self.max_payload,
            )
        };
        // Some devices refuse an inline size they cannot grant: retry
        // without inline data rather than fail.
        let hw = match create(request) {
            Err(libc::EINVAL) if request.max_inline_data > 0 => create(QpCapRaw {
                max_inline_data: 0,
                ..request
            }),
            other => other,
        }
        .map_err(|errno| self.errno(Verb::CreateQp, errno))?;
        let granted = hw.cap();
        // Keep each device queue large enough for every work request its
        // queue pairs may have outstanding.
        let grow = [
            (attr.send_cq, granted.max_send_wr),
            (attr.recv_cq, granted.max_recv_wr),
        ];
        for (cq, wrs) in grow {
            let entry = self
                .cqs
                .get_mut(&cq)
                .ok_or_else(|| invalid("completion queue"))?;
            let want = entry.attached_wrs + wrs;
            entry.cq.grow(want).map_err(|errno| {
                logic::errno_error(Verb::CreateCq, errno, &self.verbs.device.name)
            })?;
            entry.attached_wrs = want;
        }
        let cap = crate::QpCap {
            max_send_wr: cap.max_send_wr.min(granted.max_send_wr),
            max_recv_wr: cap.max_recv_wr.min(granted.max_recv_wr),
            max_send_sge: cap.max_send_sge,
            max_inline_data: cap.max_inline_data.min(granted.max_inline_data),
        };
        let qp_num = hw.qp_num();
        let info = self.verbs.insert_qp(pd, attr, cap, qp_num, ());
        let info = match info {
            Ok(info) => info,
            Err(err) => {
                for (cq, wrs) in grow {
                    if let Some(entry) = self.cqs.get_mut(&cq) {
                        entry.attached_wrs = entry.attached_wrs.saturating_sub(wrs);
                    }
                }
                return Err(err);
            }
        };
        self.qp_nums.insert(qp_num, info.handle);
        self.qps.insert(
            info.handle,
            HwQp {
                recv_layout: RecvLayout::new(granted.max_recv_wr as usize, self.max_payload),
                recv_slots: SlotPool::new(granted.max_recv_wr),
                recv_wrs: vec![None; granted.max_recv_wr as usize],
                sends: vec![None; granted.max_send_wr as usize],
                send_cq: attr.send_cq,
                recv_cq: attr.recv_cq,
                hw,
            },
        );
        Ok(info)
    }

    fn modify_qp(&mut self, qp: QpHandle, transition: &QpTransition) -> Result<()> {
        let state = self.verbs.qp(qp)?.state;
        let hw = self.qps.get_mut(&qp).ok_or_else(|| invalid("queue pair"))?;
        let done = match (state, transition) {
            (
                QpState::Reset,
                QpTransition::Init {
                    pkey_index,
                    qkey,
                    port,
                },
            ) => {
                // The bookkeeping refuses a bad port or index first.
                self.verbs.port(*port)?;
                Some(hw.hw.modify_init(*pkey_index, *port, *qkey))
            }
            (QpState::Init, QpTransition::Rtr) => Some(hw.hw.modify_rtr()),
            (QpState::Rtr, QpTransition::Rts { sq_psn }) => Some(hw.hw.modify_rts(*sq_psn)),
            // Out of order: the bookkeeping names the error.
            _ => None,
        };
        if let Some(Err(errno)) = done {
            return Err(self.errno(Verb::ModifyQp, errno));
        }
        self.verbs.modify_qp(qp, transition)
    }

    fn qp_state(&self, qp: QpHandle) -> Result<QpState> {
        Ok(self.verbs.qp(qp)?.state)
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<()> {
        let qp_num = self.verbs.qp(qp)?.qp_num;
        self.verbs.remove_qp(qp)?;
        self.qp_nums.remove(&qp_num);
        if let Some(hw) = self.qps.remove(&qp) {
            let cap = hw.hw.cap();
            for (cq, wrs) in [(hw.send_cq, cap.max_send_wr), (hw.recv_cq, cap.max_recv_wr)] {
                if let Some(entry) = self.cqs.get_mut(&cq) {
                    entry.attached_wrs = entry.attached_wrs.saturating_sub(wrs);
                }
            }
            // Dropping `hw` destroys the queue pair, then frees its staging.
        }
        Ok(())
    }

    fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let NodeAddr::Ib { lid, gid } = attr.dest else {
            return Err(FabricError::InvalidArgument {
                what: "address handle",
                detail: format!("{} is not an InfiniBand or RoCE address", attr.dest),
            });
        };
        self.verbs.port(attr.port)?;
        let local = self
            .locals
            .iter()
            .find(|l| l.port == attr.port)
            .ok_or_else(|| FabricError::NoSuchPort {
                device: self.verbs.device.name.clone(),
                port: attr.port,
            })?;
        let spec = AhSpec::build(local, lid, Gid(gid), attr.service_level, attr.src_path_bits)?;
        let hw_pd = self
            .pds
            .get(&pd)
            .ok_or_else(|| invalid("protection domain"))?;
        let ah = hw_pd
            .create_ah(&spec)
            .map_err(|errno| self.errno(Verb::CreateAh, errno))?;
        let handle = self.verbs.insert_ah(pd, attr, ah)?;
        self.peers_by_lid.insert(lid, gid);
        self.lids_by_gid.insert(gid, lid);
        Ok(handle)
    }

    fn destroy_ah(&mut self, ah: AhHandle) -> Result<()> {
        // Sends still posted keep the hardware handle alive until their
        // completions are polled.
        self.verbs.destroy_ah(ah)
    }

    fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        let checked = self.verbs.post_recv(qp, wrs);
        let accepted = match &checked {
            Ok(()) => wrs.len(),
            Err(err) => err.posted,
        };
        let hw = self.qps.get_mut(&qp).ok_or(PostError {
            posted: 0,
            error: invalid("queue pair"),
        })?;
        let mut reqs = Vec::with_capacity(accepted);
        for wr in &wrs[..accepted] {
            // The bookkeeping bounds posted receives by the granted queue
            // depth, so a slot is always free here.
            let Some(slot) = hw.recv_slots.take() else {
                break;
            };
            if let Some(keep) = hw.recv_wrs.get_mut(slot as usize) {
                *keep = Some(*wr);
            }
            reqs.push((slot, hw.recv_layout.post_len(wr.sge.len)));
        }
        let result = hw.hw.post_recv(&reqs);
        let posted = match &result {
            Ok(()) => reqs.len(),
            Err((posted, _)) => *posted,
        };
        // Undo what the device did not take.
        for &(slot, _) in &reqs[posted..] {
            hw.recv_slots.give(slot);
            if let Some(keep) = hw.recv_wrs.get_mut(slot as usize) {
                *keep = None;
            }
        }
        if posted < accepted {
            if let Ok(entry) = self.verbs.qp_mut(qp) {
                for _ in posted..accepted {
                    entry.recv_queue.pop_back();
                }
            }
            let capacity = self.verbs.qp(qp).map_or(0, |e| e.cap.max_recv_wr as usize);
            let errno = result.err().map_or(libc::ENOMEM, |(_, errno)| errno);
            return Err(PostError {
                posted,
                error: logic::post_errno_error(
                    errno,
                    "receive queue",
                    capacity,
                    &self.verbs.device.name,
                ),
            });
        }
        checked
    }

    fn check_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        let entry = self.verbs.qp(qp)?;
        let len = self.verbs.check_send(entry, wr)?;
        let hw = self.qps.get(&qp).ok_or_else(|| invalid("queue pair"))?;
        if hw.hw.send_room() == 0 {
            return Err(FabricError::QueueFull {
                queue: "send queue",
                capacity: entry.cap.max_send_wr as usize,
            });
        }
        Ok(len)
    }

    fn post_send(&mut self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let mut posted = 0;
        while posted < wrs.len() {
            // Free the slots of sends the device has finished with.
            let send_cq = self
                .qps
                .get(&qp)
                .map(|hw| (hw.send_cq, hw.hw.send_room()))
                .ok_or(PostError {
                    posted,
                    error: invalid("queue pair"),
                })?;
            if send_cq.1 < (wrs.len() - posted).min(SEND_BATCH) {
                let room = self.verbs.cq_room(send_cq.0);
                self.reap(send_cq.0, room)
                    .map_err(|error| PostError { posted, error })?;
            }
            let end = (posted + SEND_BATCH).min(wrs.len());
            match self.post_send_batch(qp, &wrs[posted..end]) {
                Ok(n) => posted += n,
                Err((n, error)) => {
                    return Err(PostError {
                        posted: posted + n,
                        error,
                    });
                }
            }
        }
        Ok(())
    }

    fn poll_cq(&mut self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        self.polls = self.polls.wrapping_add(1);
        if self.polls % EVENT_INTERVAL == 0 {
            self.handle_async_events();
        }
        if let Some(reason) = &self.fatal {
            return Err(FabricError::DeviceLost {
                device: self.verbs.device.name.clone(),
                reason: reason.clone(),
            });
        }
        let queued = self
            .verbs
            .cqs
            .get(cq.0)
            .map(crate::bookkeeping::CqEntry::queued)
            .ok_or_else(|| invalid("completion queue"))?;
        if queued < out.len() {
            let room = self.verbs.cq_room(cq).min(out.len() - queued);
            self.reap(cq, room)?;
        }
        self.verbs.drain_completions(cq, out)
    }

    /// `None`: blocking on an `ibv_comp_channel` is not wired up yet; poll.
    fn completion_channel(&mut self, cq: CqHandle) -> Result<Option<CompletionChannel>> {
        self.verbs
            .cqs
            .get(cq.0)
            .ok_or_else(|| invalid("completion queue"))?;
        Ok(None)
    }

    fn now(&self) -> Duration {
        monotonic_since_epoch()
    }

    fn stats(&self) -> FabricStats {
        self.verbs.stats
    }

    fn resources(&self) -> ResourceCounts {
        self.verbs.resources()
    }
}
