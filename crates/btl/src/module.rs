//! A BTL module: one active port, its queue pairs, its receive pool, its
//! fragments and its endpoints.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use udbtl_fabric::{
    AhAttr, AhHandle, Context, CqHandle, FabricError, GRH_LEN, Gather, Mr, NodeAddr, PdHandle,
    PortAttr, QpAddr, QpCap, QpInfo, QpInitAttr, QpTransition, RecvWr, SendFlags, SendWr, Sge,
    WcOpcode, WcStatus, WorkCompletion,
};
use udbtl_reliability::{Reliability, Transmit};
use udbtl_wire::{btl, modex, rel};

use crate::convertor::Convertor;
use crate::error::{BtlError, SendFailure};
use crate::frag::{DesFlags, Descriptor, FragKind, FragPool, FragState, UserData};
use crate::params::Params;
use crate::rcache::{RegCache, RegCacheStats, RegId};
use crate::{EndpointId, NUM_QP, NUM_WC, Tag};

mod reliable;

/// Bytes of registered memory a user fragment has for the BTL header and the
/// caller's reserved header.
const USER_FRAG_STRIDE: usize = 64;
/// The most a caller may reserve in front of zero-copy data.
pub const USER_RESERVE_MAX: usize = USER_FRAG_STRIDE - btl::HEADER_LEN;
/// Alignment of every fragment in registered memory.
const FRAG_ALIGN: usize = 64;
/// Inline data requested for each queue pair (the seed asked for 200).
const INLINE_REQUEST: u32 = 200;

/// What a receive callback sees. The payload is only valid during the
/// callback: its buffer is reposted as soon as the callback returns.
#[derive(Debug)]
pub struct RecvEvent<'a> {
    /// The tag the sender used.
    pub tag: Tag,
    /// The sender's endpoint on this module, if the sender was added.
    pub endpoint: Option<EndpointId>,
    /// The value the caller attached to that endpoint with
    /// [`Module::set_endpoint_context`] (a rank, say), if any.
    pub endpoint_context: Option<u64>,
    /// The sender's queue pair.
    pub src: QpAddr,
    /// The bytes after the BTL header.
    pub payload: &'a [u8],
}

/// What the send callback sees when a descriptor's send completes.
#[derive(Debug, Clone)]
pub struct SendEvent {
    /// The descriptor. If it carries [`DesFlags::BTL_OWNERSHIP`] the BTL
    /// frees it right after the callback, and the handle goes stale.
    pub descriptor: Descriptor,
    /// The endpoint it was sent to.
    pub endpoint: EndpointId,
    /// The caller's context value set with [`Module::set_context`].
    pub context: u64,
    /// Whether the datagram left.
    pub status: Result<(), SendFailure>,
}

/// What the error callback sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorEvent {
    /// `true` when the module can no longer be used.
    pub fatal: bool,
    /// What happened.
    pub message: String,
}

/// A receive callback, registered per tag.
pub type RecvCallback = Box<dyn FnMut(&RecvEvent<'_>) + Send>;
/// The send completion callback.
pub type SendCallback = Box<dyn FnMut(&SendEvent) + Send>;
/// The error callback.
pub type ErrorCallback = Box<dyn FnMut(&ErrorEvent) + Send>;

/// How `send` disposed of a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// Posted to a queue pair; the send callback follows its completion.
    Posted,
    /// No send credit was free: queued on the pending list, to be posted at
    /// the next send completion.
    Queued,
}

/// Sizes a module works with, derived from the parameters and the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload of an `alloc`ed fragment (max send size less the BTL
    /// header).
    pub eager_limit: usize,
    /// Largest payload of one fragment of any kind.
    pub max_send_size: usize,
    /// Data size of the first fragment of a rendezvous (`min_send_size`).
    pub rndv_eager_limit: usize,
    /// Bytes a send may carry inline.
    pub inline_max: usize,
    /// Exclusivity, for choosing between BTLs.
    pub exclusivity: u32,
    /// Bandwidth in MB/s, for striping weights.
    pub bandwidth: u32,
    /// Receive buffers posted.
    pub recv_buffers: usize,
    /// Bytes of each receive buffer (see [`recv_buffer_len`]).
    pub recv_buffer_len: usize,
    /// BTL header bytes in front of every payload: 8, or 40 with the
    /// reliability extension.
    pub header_len: usize,
}

/// Counters of one module.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModuleStats {
    /// Sends posted to the fabric.
    pub sends_posted: u64,
    /// Send completions processed.
    pub sends_completed: u64,
    /// Sends that failed (post refused from the pending list, or an error
    /// completion).
    pub send_errors: u64,
    /// Sends that had to wait on the pending list.
    pub sends_queued: u64,
    /// Datagrams delivered to a tag callback.
    pub recvs_delivered: u64,
    /// Receives dropped: BTL header malformed.
    pub recv_malformed: u64,
    /// Receives dropped: job key of another job.
    pub recv_bad_job_key: u64,
    /// Receives dropped: no callback for the tag.
    pub recv_no_callback: u64,
    /// Receive completions with an error status (buffer reposted).
    pub recv_errors: u64,
    /// Deepest the pending list has been.
    pub pending_high_water: usize,
    /// Reliable receives dropped: checksum mismatch.
    pub recv_bad_checksum: u64,
    /// Reliable receives dropped: from no known endpoint, or from a process
    /// that reused a known endpoint's address.
    pub recv_unknown_peer: u64,
    /// Reliable sends the fabric refused; retransmitted like a loss.
    pub transmit_failures: u64,
    /// Messages reassembled from several datagrams.
    pub messages_reassembled: u64,
}

#[derive(Debug)]
struct Endpoint {
    /// The peer's receiving queue pair.
    remote: QpAddr,
    /// Every queue pair the peer sends from.
    senders: [QpAddr; modex::QPNS],
    /// The peer process's id, which its reliable datagrams carry.
    proc_id: u32,
    ah: AhHandle,
    /// The caller's value for this endpoint, handed to receive callbacks.
    context: Option<u64>,
}

/// One module per active port.
pub struct Module<C: Context> {
    ctx: C,
    device: String,
    port: PortAttr,
    pd: PdHandle,
    cq: CqHandle,
    qps: Vec<QpInfo>,
    qp_next: u32,
    recv_mr: Mr,
    recv_stride: usize,
    recv_count: usize,
    send_frags: FragPool,
    user_frags: FragPool,
    rcache: RegCache,
    pending: VecDeque<Descriptor>,
    sd_wqe: u32,
    endpoints: Vec<Option<Endpoint>>,
    free_endpoints: Vec<u32>,
    by_addr: HashMap<QpAddr, EndpointId>,
    callbacks: Vec<Option<RecvCallback>>,
    send_callback: Option<SendCallback>,
    error_callback: Option<ErrorCallback>,
    wcs: Box<[WorkCompletion]>,
    reposts: Vec<RecvWr>,
    limits: Limits,
    qkey: u32,
    job_key: u32,
    /// Service level put into every address handle.
    sl: u8,
    /// Source path bits put into every address handle.
    path_bits: u8,
    stats: ModuleStats,
    /// Reliability state of every endpoint; `None` when `reliable` is off.
    rel: Option<Reliability<Descriptor, u32>>,
    /// The reliability clock's epoch.
    epoch: std::time::Instant,
    /// BTL header bytes in front of every payload: 8, plus the 32-byte
    /// reliability extension when reliable.
    header_len: usize,
    /// Checksum reliable datagrams.
    checksum: bool,
    /// This process's id, published in the modex and carried in reliable
    /// datagrams.
    proc_id: u32,
    /// Registered buffers for acknowledgement-only datagrams, used in turn.
    ack_mr: Mr,
    ack_next: usize,
    /// Reliable transmissions waiting for a send credit, oldest first.
    tx_backlog: VecDeque<Transmit<Descriptor>>,
    /// Messages being reassembled, per endpoint: the tag and bytes so far.
    reassembly: HashMap<u32, (u8, Vec<u8>)>,
    /// The reliability clock as read at the start of the current batch.
    clock: udbtl_reliability::Instant,
    /// Senders not known yet, by process id (see `take_unknown_peers`).
    unknown_peers: Vec<u32>,
    /// The sender of the last datagram received, and its endpoint: most
    /// traffic comes in runs from one peer, which then costs no hash lookup.
    last_sender: Option<(QpAddr, EndpointId)>,
}

impl<C: Context> fmt::Debug for Module<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("device", &self.device)
            .field("port", &self.port.port_num)
            .field("limits", &self.limits)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Resources created so far by module initialisation, released in reverse
/// order if a later step fails.
#[derive(Default)]
struct Partial {
    pd: Option<PdHandle>,
    cq: Option<CqHandle>,
    qps: Vec<QpInfo>,
    recv_mr: Option<Mr>,
    ack_mr: Option<Mr>,
    pools: Vec<FragPool>,
}

impl Partial {
    fn unwind<C: Context>(mut self, ctx: &mut C) {
        for pool in &mut self.pools {
            let _ = pool.release(ctx);
        }
        for mr in [self.recv_mr, self.ack_mr].into_iter().flatten() {
            let _ = ctx.dereg_mr(mr.handle);
        }
        for qp in self.qps {
            let _ = ctx.destroy_qp(qp.handle);
        }
        if let Some(cq) = self.cq {
            let _ = ctx.destroy_cq(cq);
        }
        if let Some(pd) = self.pd {
            let _ = ctx.dealloc_pd(pd);
        }
    }
}

/// Deregisters memory the registration cache evicted. A refusal can only
/// mean the registration is already gone, so it is logged, not raised.
fn deregister<C: Context>(ctx: &mut C, mr: Mr) {
    if let Err(err) = ctx.dereg_mr(mr.handle) {
        tracing::warn!(%err, "deregistering evicted memory failed");
    }
}

fn round_up(value: usize, align: usize) -> usize {
    value.div_ceil(align) * align
}

/// Receive buffer size for a maximum send size: the GRH the fabric writes in
/// front, the BTL header and the largest payload, rounded to the fragment
/// alignment. Allocation and posting both use this one value, which fixes
/// the seed's bug of allocating fewer bytes than it posted.
pub fn recv_buffer_len(max_send_size: usize) -> usize {
    round_up(GRH_LEN + HEADER_MAX + max_send_size, FRAG_ALIGN)
}

/// The longest BTL header: base header plus reliability extension.
const HEADER_MAX: usize = btl::HEADER_LEN + rel::HEADER_LEN;
/// Registered buffers for acknowledgement-only datagrams.
const ACK_SLOTS: usize = 64;
/// Bytes of one acknowledgement buffer.
const ACK_LEN: usize = HEADER_MAX;

impl<C: Context> Module<C> {
    /// Builds a module on `port` of an opened device, in the seed's order:
    /// protection domain, registration cache, completion queue of depth
    /// `rd_num + sd_num`, [`NUM_QP`] queue pairs moved to RTS, `rd_num`
    /// receive buffers posted at once, then the send and user free lists.
    /// A failure unwinds what was built, in reverse, and hands the context
    /// back with the error.
    ///
    /// # Errors
    /// The failing step and its verbs error.
    pub fn new(mut ctx: C, port: u8, params: &Params) -> Result<Self, (C, BtlError)> {
        let mut partial = Partial::default();
        match Self::build(&mut ctx, port, params, &mut partial) {
            Ok(parts) => Ok(Self::assemble(ctx, partial, parts, params)),
            Err(err) => {
                partial.unwind(&mut ctx);
                Err((ctx, err))
            }
        }
    }

    fn build(
        ctx: &mut C,
        port_num: u8,
        params: &Params,
        partial: &mut Partial,
    ) -> Result<Built, BtlError> {
        let device = ctx.device().name.clone();
        let fail = |step: &'static str| {
            let device = device.clone();
            move |source: FabricError| BtlError::Fabric {
                step,
                device,
                port: port_num,
                source,
            }
        };
        let port = ctx.query_port(port_num).map_err(fail("query port"))?;
        let limits = limits_for(&port, params);
        let pd = ctx.alloc_pd().map_err(fail("allocate protection domain"))?;
        partial.pd = Some(pd);
        let depth = params.rd_num + params.sd_num;
        let cq = ctx
            .create_cq(depth)
            .map_err(fail("create completion queue"))?;
        partial.cq = Some(cq);
        let cap = QpCap {
            max_send_wr: params.sd_num,
            max_recv_wr: params.rd_num,
            max_send_sge: 2,
            max_inline_data: INLINE_REQUEST,
        };
        let mut inline_max = usize::MAX;
        for _ in 0..NUM_QP {
            let qp = ctx
                .create_qp(
                    pd,
                    &QpInitAttr {
                        send_cq: cq,
                        recv_cq: cq,
                        cap,
                    },
                )
                .map_err(fail("create queue pair"))?;
            partial.qps.push(qp);
            // The smallest grant over all queue pairs, not the last one's
            // (a seed bug): any queue pair may carry any send.
            inline_max = inline_max.min(qp.cap.max_inline_data as usize);
            let init = QpTransition::Init {
                pkey_index: params.ib_pkey_index,
                qkey: params.ib_qkey,
                port: port_num,
            };
            ctx.modify_qp(qp.handle, &init)
                .map_err(fail("move queue pair to INIT"))?;
            ctx.modify_qp(qp.handle, &QpTransition::Rtr)
                .map_err(fail("move queue pair to RTR"))?;
            ctx.modify_qp(qp.handle, &QpTransition::Rts { sq_psn: 0 })
                .map_err(fail("move queue pair to RTS"))?;
        }
        let recv_stride = recv_buffer_len(limits.max_send_size);
        let recv_count = recv_pool_size(params, recv_stride);
        let recv_mr = ctx
            .reg_mr(pd, recv_count * recv_stride)
            .map_err(fail("register receive buffers"))?;
        partial.recv_mr = Some(recv_mr);
        // Receives are posted on queue pair 0 only: it is the one published.
        let wrs: Vec<RecvWr> = (0..recv_count)
            .map(|i| RecvWr {
                wr_id: i as u64,
                sge: Sge {
                    lkey: recv_mr.lkey,
                    offset: i * recv_stride,
                    len: recv_stride,
                },
            })
            .collect();
        let qp0 = partial.qps[0].handle;
        ctx.post_recv(qp0, &wrs)
            .map_err(|e| fail("post receive buffers")(e.error))?;

        let ack_mr = ctx
            .reg_mr(pd, ACK_SLOTS * ACK_LEN)
            .map_err(fail("register acknowledgement buffers"))?;
        partial.ack_mr = Some(ack_mr);
        let send_stride = round_up(header_len(params) + limits.eager_limit, FRAG_ALIGN);
        let increment = (params.sd_num as usize >> 1).max(1);
        let mut send_frags = FragPool::new(
            FragKind::Send,
            send_stride,
            increment,
            params.send_frags_max.max(increment),
        );
        send_frags
            .grow(ctx, pd, increment)
            .map_err(fail("register send fragments"))?;
        partial.pools.push(send_frags);
        let mut user_frags = FragPool::new(
            FragKind::User,
            USER_FRAG_STRIDE,
            increment,
            params.user_frags_max.max(increment),
        );
        user_frags
            .grow(ctx, pd, increment)
            .map_err(fail("register user fragments"))?;
        partial.pools.push(user_frags);
        let limits = Limits {
            inline_max,
            recv_buffers: recv_count,
            recv_buffer_len: recv_stride,
            ..limits
        };
        Ok(Built {
            port,
            limits,
            recv_stride,
            recv_count,
        })
    }

    fn assemble(ctx: C, mut partial: Partial, built: Built, params: &Params) -> Self {
        let user_frags = partial.pools.pop();
        let send_frags = partial.pools.pop();
        let (Some(send_frags), Some(user_frags), Some(pd), Some(cq), Some(recv_mr), Some(ack_mr)) = (
            send_frags,
            user_frags,
            partial.pd,
            partial.cq,
            partial.recv_mr,
            partial.ack_mr,
        ) else {
            unreachable!("build() fills every resource before returning Ok")
        };
        let device = ctx.device().name.clone();
        // UDP checks its own checksum; the simulator corrupts.
        let fabric_checks_integrity = built.port.link_layer != "sim";
        Self {
            ctx,
            device,
            port: built.port,
            pd,
            cq,
            qps: partial.qps,
            qp_next: 0,
            recv_mr,
            recv_stride: built.recv_stride,
            recv_count: built.recv_count,
            send_frags,
            user_frags,
            rcache: RegCache::new(
                params.rcache_max_entries,
                params.rcache_max_bytes,
                params.mpool != "none",
            ),
            pending: VecDeque::new(),
            sd_wqe: params.sd_num,
            endpoints: Vec::new(),
            free_endpoints: Vec::new(),
            by_addr: HashMap::new(),
            callbacks: (0..256).map(|_| None).collect(),
            send_callback: None,
            error_callback: None,
            wcs: vec![WorkCompletion::EMPTY; NUM_WC].into_boxed_slice(),
            reposts: Vec::with_capacity(NUM_WC),
            limits: built.limits,
            qkey: params.ib_qkey,
            job_key: params.job_key,
            sl: params.ib_service_level,
            path_bits: params.ib_src_path_bits,
            stats: ModuleStats::default(),
            rel: reliable::endpoint_state(params),
            epoch: std::time::Instant::now(),
            header_len: header_len(params),
            checksum: match params.checksum.as_str() {
                "on" => true,
                "off" => false,
                _ => !fabric_checks_integrity,
            },
            proc_id: reliable::process_id(),
            ack_mr,
            ack_next: 0,
            tx_backlog: VecDeque::new(),
            reassembly: HashMap::new(),
            clock: udbtl_reliability::Instant::ZERO,
            last_sender: None,
            unknown_peers: Vec::new(),
        }
    }
}

/// BTL header bytes in front of every payload.
fn header_len(params: &Params) -> usize {
    if params.reliable {
        HEADER_MAX
    } else {
        btl::HEADER_LEN
    }
}

struct Built {
    port: PortAttr,
    limits: Limits,
    recv_stride: usize,
    recv_count: usize,
}

/// Fewest receive buffers `rd_mem` may lower the pool to.
const MIN_RECV_BUFFERS: usize = 64;

/// Receive buffers to post: `rd_num`, unless it was left at its default and
/// that many buffers of `stride` bytes exceed `rd_mem`. The seed's 6000
/// assumed 2 KB datagrams; on UDP loopback a buffer holds 64 KiB.
fn recv_pool_size(params: &Params, stride: usize) -> usize {
    let asked = params.rd_num as usize;
    if params.source("rd_num") == Some(crate::params::Source::Default) {
        asked.min((params.rd_mem / stride).max(MIN_RECV_BUFFERS))
    } else {
        asked
    }
}

/// Where a parameter is unset, the port's largest datagram decides: the
/// seed's 2048 bytes assumed a 2 KB InfiniBand MTU.
fn limits_for(port: &PortAttr, params: &Params) -> Limits {
    let max_send_size = match params.max_send_size {
        Some(asked) if asked > port.max_msg_size => {
            tracing::warn!(
                asked,
                port_max = port.max_msg_size,
                "max_send_size exceeds the port's largest datagram; using the port's"
            );
            port.max_msg_size
        }
        Some(asked) => asked,
        None => port.max_msg_size,
    };
    let eager_limit = max_send_size.saturating_sub(header_len(params));
    Limits {
        eager_limit,
        max_send_size: eager_limit,
        rndv_eager_limit: params.min_send_size.unwrap_or(eager_limit).min(eager_limit),
        inline_max: 0,
        exclusivity: params.exclusivity,
        bandwidth: params.bandwidth,
        recv_buffers: 0,
        recv_buffer_len: 0,
        header_len: header_len(params),
    }
}

/// The result of [`Module::add_procs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddProcs {
    /// One slot per peer: its endpoint, or `None` if unreachable.
    pub endpoints: Vec<Option<EndpointId>>,
    /// Bit `i` is set when peer `i` is reachable (the BTL's bitmap).
    pub reachable: Vec<bool>,
}

impl<C: Context> Module<C> {
    // ----- addressing ---------------------------------------------------

    /// This module's published address.
    pub fn address(&self) -> modex::Address {
        modex::Address {
            location: match self.port.addr {
                NodeAddr::Ip(std::net::IpAddr::V4(ip)) => modex::Location::Ipv4(ip.octets()),
                NodeAddr::Ip(std::net::IpAddr::V6(ip)) => modex::Location::Ipv6(ip.octets()),
                NodeAddr::Sim(id) => modex::Location::Sim(id),
                NodeAddr::Ib { lid, gid } => modex::Location::Ib { lid, gid },
                _ => modex::Location::Sim(u32::MAX),
            },
            port: self.port.port_num,
            qpns: core::array::from_fn(|i| self.qps.get(i).map_or(0, |qp| qp.qp_num)),
            proc_id: self.proc_id,
            max_msg_size: u32::try_from(self.port.max_msg_size).unwrap_or(u32::MAX),
            network: self.port.network,
        }
    }

    /// Turns peers' published addresses into endpoints. `peers[i]` is peer
    /// `i`'s address list, or `None` if it published nothing. A peer with no
    /// address on this module's network is unreachable through this module;
    /// that is not an error for the whole call (a seed bug).
    ///
    /// # Errors
    /// A verbs failure creating an address handle; endpoints created before
    /// it are released.
    pub fn add_procs(&mut self, peers: &[Option<&[modex::Address]>]) -> Result<AddProcs, BtlError> {
        let mut result = AddProcs {
            endpoints: vec![None; peers.len()],
            reachable: vec![false; peers.len()],
        };
        for (i, peer) in peers.iter().enumerate() {
            let Some((qps, proc_id)) = peer.and_then(|addrs| self.pick_address(addrs)) else {
                continue;
            };
            match self.add_endpoint(qps, proc_id) {
                Ok(id) => {
                    result.endpoints[i] = Some(id);
                    result.reachable[i] = true;
                }
                Err(err) => {
                    let created: Vec<EndpointId> =
                        result.endpoints.iter().flatten().copied().collect();
                    let _ = self.del_procs(&created);
                    return Err(err);
                }
            }
        }
        Ok(result)
    }

    /// The peer address this module can reach: on the same network, the same
    /// kind of address, and a matching port number when the peer has several.
    fn pick_address(&self, addrs: &[modex::Address]) -> Option<([QpAddr; modex::QPNS], u32)> {
        let mine = self.address();
        let compatible = |a: &&modex::Address| {
            a.network == mine.network
                && core::mem::discriminant(&a.location) == core::mem::discriminant(&mine.location)
        };
        let chosen = addrs
            .iter()
            .filter(compatible)
            .find(|a| a.port == mine.port)
            .or_else(|| addrs.iter().find(compatible))?;
        let node = match chosen.location {
            modex::Location::Ipv4(ip) => NodeAddr::Ip(ip.into()),
            modex::Location::Ipv6(ip) => NodeAddr::Ip(ip.into()),
            modex::Location::Sim(id) => NodeAddr::Sim(id),
            modex::Location::Ib { lid, gid } => NodeAddr::Ib { lid, gid },
        };
        Some((chosen.qpns.map(|qpn| QpAddr { node, qpn }), chosen.proc_id))
    }

    /// Creates an endpoint for a peer module whose queue pairs are `qps`
    /// (the first receives; datagrams from any of them are recognised as the
    /// peer's) in process `proc_id`, with an address handle built with the
    /// service level and path bits parameters.
    ///
    /// # Errors
    /// The address handle could not be created.
    pub fn add_endpoint(
        &mut self,
        qps: [QpAddr; modex::QPNS],
        proc_id: u32,
    ) -> Result<EndpointId, BtlError> {
        let remote = qps[0];
        if let Some(id) = self.by_addr.get(&remote) {
            return Ok(*id);
        }
        let attr = AhAttr {
            dest: remote.node,
            service_level: self.sl,
            src_path_bits: self.path_bits,
            port: self.port.port_num,
        };
        let ah = self
            .ctx
            .create_ah(self.pd, &attr)
            .map_err(|source| BtlError::Fabric {
                step: "create address handle",
                device: self.device.clone(),
                port: self.port.port_num,
                source,
            })?;
        let endpoint = Endpoint {
            remote,
            senders: qps,
            proc_id,
            ah,
            context: None,
        };
        let id = if let Some(rel) = self.rel.as_mut() {
            // Reliable endpoints are never reused: a closed one lingers.
            let peer = rel.add_peer(reliable::now(self.epoch));
            self.endpoints.push(Some(endpoint));
            debug_assert_eq!(peer.0 as usize, self.endpoints.len() - 1);
            // Every peer may fill its credit at once: share the receive pool
            // so that all of them together cannot overrun it (a few buffers
            // stay for acknowledgements).
            let peers = self.endpoints.iter().flatten().count().max(1);
            let share = (self.recv_count * 7 / 8) / peers;
            rel.set_credit(u16::try_from(share).unwrap_or(u16::MAX).max(2));
            EndpointId(peer.0)
        } else if let Some(slot) = self.free_endpoints.pop() {
            self.endpoints[slot as usize] = Some(endpoint);
            EndpointId(slot)
        } else {
            self.endpoints.push(Some(endpoint));
            EndpointId((self.endpoints.len() - 1) as u32)
        };
        for qp in qps.iter().filter(|qp| qp.qpn != 0) {
            self.by_addr.insert(*qp, id);
        }
        Ok(id)
    }

    /// Releases endpoints and their address handles. Sends still pending to
    /// them complete with an error first.
    ///
    /// # Errors
    /// An unknown endpoint, or an address handle the fabric refused to free.
    pub fn del_procs(&mut self, endpoints: &[EndpointId]) -> Result<(), BtlError> {
        for id in endpoints {
            let slot = self
                .endpoints
                .get_mut(id.0 as usize)
                .ok_or(BtlError::BadEndpoint { endpoint: id.0 })?;
            let endpoint = slot
                .take()
                .ok_or(BtlError::BadEndpoint { endpoint: id.0 })?;
            for qp in &endpoint.senders {
                self.by_addr.remove(qp);
            }
            self.last_sender = None;
            match self.rel.as_mut() {
                Some(rel) => {
                    rel.close_peer(reliable::now(self.epoch), udbtl_reliability::PeerId(id.0))
                }
                None => self.free_endpoints.push(id.0),
            }
            let stranded: Vec<Descriptor> = self
                .pending
                .iter()
                .copied()
                .filter(|des| self.frag_endpoint(*des) == Some(id.0))
                .collect();
            self.pending.retain(|des| !stranded.contains(des));
            for des in stranded {
                self.complete_send(des, Err(SendFailure::Refused("endpoint deleted".into())));
            }
            self.ctx
                .destroy_ah(endpoint.ah)
                .map_err(|source| BtlError::Fabric {
                    step: "destroy address handle",
                    device: self.device.clone(),
                    port: self.port.port_num,
                    source,
                })?;
        }
        Ok(())
    }

    /// Attaches a value of the caller's to an endpoint (the peer's rank,
    /// say); receive callbacks get it back as
    /// [`RecvEvent::endpoint_context`], so mapping a sender costs no lookup.
    ///
    /// # Errors
    /// An unknown endpoint.
    pub fn set_endpoint_context(
        &mut self,
        endpoint: EndpointId,
        context: u64,
    ) -> Result<(), BtlError> {
        let entry = self
            .endpoints
            .get_mut(endpoint.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(BtlError::BadEndpoint {
                endpoint: endpoint.0,
            })?;
        entry.context = Some(context);
        Ok(())
    }

    fn endpoint_context(&self, endpoint: Option<EndpointId>) -> Option<u64> {
        self.endpoints.get(endpoint?.0 as usize)?.as_ref()?.context
    }

    /// The remote queue pair of an endpoint.
    pub fn endpoint_addr(&self, endpoint: EndpointId) -> Option<QpAddr> {
        self.endpoints
            .get(endpoint.0 as usize)?
            .as_ref()
            .map(|e| e.remote)
    }

    // ----- descriptors --------------------------------------------------

    fn pool(&self, des: Descriptor) -> &FragPool {
        match des.kind() {
            FragKind::Send => &self.send_frags,
            FragKind::User => &self.user_frags,
        }
    }

    fn pool_mut(&mut self, des: Descriptor) -> &mut FragPool {
        match des.kind() {
            FragKind::Send => &mut self.send_frags,
            FragKind::User => &mut self.user_frags,
        }
    }

    fn frag_endpoint(&self, des: Descriptor) -> Option<u32> {
        self.pool(des).frag(des).map(|f| f.endpoint)
    }

    fn bad(des: Descriptor, problem: &'static str) -> BtlError {
        BtlError::BadDescriptor {
            descriptor: des.raw(),
            problem,
        }
    }

    /// A send fragment with room for `size` bytes, from the send free list.
    /// `None` if `size` exceeds the eager limit or the list is at its bound;
    /// the caller retries after completions return fragments.
    pub fn alloc(&mut self, order: u8, size: usize, flags: DesFlags) -> Option<Descriptor> {
        if size > self.limits.eager_limit {
            return None;
        }
        let des = self.send_frags.get(&mut self.ctx, self.pd)?;
        let frag = self.send_frags.frag_mut(des)?;
        frag.seg_len = size;
        frag.flags = flags;
        frag.order = order;
        Some(des)
    }

    /// Returns a descriptor the caller owns. A send fragment goes back to its
    /// list; a user fragment releases its registration first.
    ///
    /// # Errors
    /// A stale descriptor, or one still owned by the BTL (pending or posted):
    /// a descriptor may only be freed after local completion.
    pub fn free(&mut self, des: Descriptor) -> Result<(), BtlError> {
        let state = self
            .pool(des)
            .frag(des)
            .ok_or_else(|| Self::bad(des, "not allocated"))?
            .state;
        if state != FragState::Allocated {
            return Err(Self::bad(des, "still owned by the BTL"));
        }
        self.release(des);
        Ok(())
    }

    fn release(&mut self, des: Descriptor) {
        if let Some(user) = self.pool_mut(des).frag_mut(des).and_then(|f| f.user.take()) {
            if let Err(err) = self.rcache.release(&mut self.ctx, user.reg, deregister) {
                tracing::error!(%err, "user fragment held no registration reference");
            }
        }
        self.pool_mut(des).put(des);
    }

    /// Prepares a descriptor holding `reserve` bytes for the caller's header
    /// followed by up to `*size` bytes from `convertor`; sets `*size` to the
    /// number of data bytes taken.
    ///
    /// Data is sent from user memory, without a copy, when the convertor is
    /// zero-copy capable (shared memory), `reserve` fits the user fragment's
    /// header room, and either `registration` is given or the data exceeds
    /// the eager limit. The data is then cut at the maximum datagram size, so
    /// a large buffer takes several calls. Otherwise the data is packed into
    /// a send fragment. Unlike the seed, the zero-copy branch returns a
    /// working descriptor, carries the BTL header in its own gather entry, and
    /// never exceeds one datagram.
    ///
    /// `None` when no fragment is free or `reserve` leaves no room.
    pub fn prepare_src(
        &mut self,
        registration: Option<RegId>,
        convertor: &mut Convertor<'_>,
        order: u8,
        reserve: usize,
        size: &mut usize,
        flags: DesFlags,
    ) -> Option<Descriptor> {
        let max_data = self.limits.max_send_size.checked_sub(reserve)?;
        let want = (*size).min(convertor.remaining());
        let zero_copy = convertor.is_contiguous()
            && reserve <= USER_RESERVE_MAX
            && (registration.is_some() || want > self.limits.eager_limit.saturating_sub(reserve));
        if zero_copy {
            if let Some(des) =
                self.prepare_user(registration, convertor, reserve, want.min(max_data), size)
            {
                let frag = self.user_frags.frag_mut(des)?;
                frag.flags = flags;
                frag.order = order;
                return Some(des);
            }
        }
        let take = want.min(self.limits.eager_limit.checked_sub(reserve)?);
        let des = self.send_frags.get(&mut self.ctx, self.pd)?;
        let packed = {
            let (mr, sge) = self
                .send_frags
                .sge(des.index(), self.header_len + reserve + take)?;
            let bytes = self.ctx.mr_bytes_mut(mr.handle).ok()?;
            let start = sge.offset + self.header_len + reserve;
            convertor.pack(&mut bytes[start..start + take])
        };
        let frag = self.send_frags.frag_mut(des)?;
        frag.seg_len = reserve + packed;
        frag.flags = flags;
        frag.order = order;
        *size = packed;
        Some(des)
    }

    fn prepare_user(
        &mut self,
        registration: Option<RegId>,
        convertor: &mut Convertor<'_>,
        reserve: usize,
        take: usize,
        size: &mut usize,
    ) -> Option<Descriptor> {
        let (data, range) = convertor.zero_copy(take)?;
        let des = self.user_frags.get(&mut self.ctx, self.pd);
        let Some(des) = des else {
            convertor.rewind(range.len());
            return None;
        };
        let pd = self.pd;
        let reg = match registration {
            Some(reg) => self.rcache.retain(reg).ok().map(|lkey| (reg, lkey)),
            // Register the whole shared buffer, not just this piece: the
            // caller cuts a large message into datagram-sized pieces, and
            // every later piece then hits the cache.
            None => self
                .rcache
                .acquire(
                    &mut self.ctx,
                    &data,
                    |c, r| c.reg_user_mr(pd, r),
                    deregister,
                )
                .ok(),
        };
        let Some((reg, lkey)) = reg else {
            self.user_frags.put(des);
            convertor.rewind(range.len());
            return None;
        };
        *size = range.len();
        let frag = self.user_frags.frag_mut(des)?;
        frag.seg_len = reserve;
        frag.user = Some(UserData {
            reg,
            lkey,
            data,
            range,
        });
        Some(des)
    }

    /// Registers user memory through the registration cache (the module's
    /// `btl_mpool`), for callers that pass a registration to
    /// [`prepare_src`](Self::prepare_src). Release it with
    /// [`mpool_deregister`](Self::mpool_deregister).
    ///
    /// # Errors
    /// The fabric refused the registration.
    pub fn mpool_register(&mut self, data: &Arc<[u8]>) -> Result<RegId, BtlError> {
        let pd = self.pd;
        let (device, port) = (self.device.clone(), self.port.port_num);
        self.rcache
            .acquire(&mut self.ctx, data, |c, r| c.reg_user_mr(pd, r), deregister)
            .map(|(reg, _)| reg)
            .map_err(|source| BtlError::Fabric {
                step: "register user memory",
                device,
                port,
                source,
            })
    }

    /// Drops a reference taken by [`mpool_register`](Self::mpool_register).
    ///
    /// # Errors
    /// The registration holds no reference.
    pub fn mpool_deregister(&mut self, reg: RegId) -> Result<(), BtlError> {
        self.rcache
            .release(&mut self.ctx, reg, deregister)
            .map_err(|_| BtlError::BadDescriptor {
                descriptor: u32::MAX,
                problem: "a registration without references",
            })
    }

    /// The bytes after the BTL header that the caller fills: the reserve and,
    /// for a send fragment, the packed payload (`alloc`'s `size` bytes).
    ///
    /// # Errors
    /// A stale descriptor.
    pub fn segment_mut(&mut self, des: Descriptor) -> Result<&mut [u8], BtlError> {
        let seg_len = self
            .pool(des)
            .frag(des)
            .ok_or_else(|| Self::bad(des, "not allocated"))?
            .seg_len;
        let (mr, sge) = self
            .pool(des)
            .sge(des.index(), self.header_len + seg_len)
            .ok_or_else(|| Self::bad(des, "without memory"))?;
        let bytes = self
            .ctx
            .mr_bytes_mut(mr.handle)
            .map_err(|_| Self::bad(des, "without memory"))?;
        let start = sge.offset + self.header_len;
        Ok(&mut bytes[start..start + seg_len])
    }

    /// Sets the value handed back in the descriptor's [`SendEvent`].
    ///
    /// # Errors
    /// A stale descriptor.
    pub fn set_context(&mut self, des: Descriptor, context: u64) -> Result<(), BtlError> {
        self.pool_mut(des)
            .frag_mut(des)
            .ok_or_else(|| Self::bad(des, "not allocated"))?
            .context = context;
        Ok(())
    }

    /// Changes the length of an allocated send fragment's segment (at most
    /// what it was allocated with), e.g. after packing fewer bytes.
    ///
    /// # Errors
    /// A stale descriptor or a longer length.
    pub fn set_segment_len(&mut self, des: Descriptor, len: usize) -> Result<(), BtlError> {
        let limit = self.limits.eager_limit;
        let frag = self
            .pool_mut(des)
            .frag_mut(des)
            .ok_or_else(|| Self::bad(des, "not allocated"))?;
        if frag.user.is_some() || len > limit {
            return Err(Self::bad(des, "too small for that length"));
        }
        frag.seg_len = len;
        Ok(())
    }
}

impl<C: Context> Module<C> {
    // ----- sending ------------------------------------------------------

    /// Sends a descriptor to an endpoint with `tag`. The BTL owns the
    /// descriptor until the send callback reports its completion.
    ///
    /// With no send credit free, the descriptor waits on the module's
    /// pending list and is posted at the next send completion. Sends are
    /// striped round-robin over the module's queue pairs.
    ///
    /// # Errors
    /// A stale or busy descriptor, an unknown endpoint, or a post the fabric
    /// refused; in every case the descriptor is back in the caller's hands
    /// and no credit is lost (the seed swallowed post failures).
    pub fn send(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
        tag: Tag,
    ) -> Result<SendStatus, BtlError> {
        if self
            .endpoints
            .get(endpoint.0 as usize)
            .and_then(Option::as_ref)
            .is_none()
        {
            return Err(BtlError::BadEndpoint {
                endpoint: endpoint.0,
            });
        }
        let job_key = self.job_key;
        let (frag_seg, state) = {
            let frag = self
                .pool_mut(des)
                .frag_mut(des)
                .ok_or_else(|| Self::bad(des, "not allocated"))?;
            (frag.seg_len, frag.state)
        };
        if state != FragState::Allocated {
            return Err(Self::bad(des, "already being sent"));
        }
        let (mr, sge) = self
            .pool(des)
            .sge(des.index(), self.header_len + frag_seg)
            .ok_or_else(|| Self::bad(des, "without memory"))?;
        let bytes = self
            .ctx
            .mr_bytes_mut(mr.handle)
            .map_err(|_| Self::bad(des, "without memory"))?;
        let header = btl::Repr {
            tag: tag.0,
            job_key,
            reliable: self.rel.is_some(),
        };
        header.emit(&mut btl::Packet::new_unchecked(
            &mut bytes[sge.offset..sge.offset + btl::HEADER_LEN],
        ));
        if let Some(frag) = self.pool_mut(des).frag_mut(des) {
            frag.endpoint = endpoint.0;
            frag.tag = tag.0;
        }
        if self.rel.is_some() {
            return self.send_reliable(endpoint, des);
        }
        if self.sd_wqe == 0 || !self.pending.is_empty() {
            // Keep order with descriptors already waiting.
            if let Some(frag) = self.pool_mut(des).frag_mut(des) {
                frag.state = FragState::Pending;
            }
            self.pending.push_back(des);
            self.stats.sends_queued += 1;
            self.stats.pending_high_water = self.stats.pending_high_water.max(self.pending.len());
            if self.sd_wqe > 0 {
                self.drain_pending();
            }
            return Ok(SendStatus::Queued);
        }
        self.post(des).map_err(|source| BtlError::Post {
            endpoint: endpoint.0,
            source,
        })?;
        Ok(SendStatus::Posted)
    }

    /// Posts one descriptor, taking a send credit. On failure the credit is
    /// returned and the descriptor is `Allocated` again.
    fn post(&mut self, des: Descriptor) -> Result<(), udbtl_fabric::PostError> {
        let refused = |error| udbtl_fabric::PostError { posted: 0, error };
        let (seg_len, endpoint, user) = {
            let frag = self
                .pool(des)
                .frag(des)
                .ok_or_else(|| refused(FabricError::InvalidHandle { kind: "descriptor" }))?;
            (frag.seg_len, frag.endpoint, frag.user.clone())
        };
        let Some(Some(ep)) = self.endpoints.get(endpoint as usize) else {
            return Err(refused(FabricError::InvalidHandle { kind: "endpoint" }));
        };
        let (ah, remote_qpn) = (ep.ah, ep.remote.qpn);
        let (_, head) = self
            .pool(des)
            .sge(des.index(), self.header_len + seg_len)
            .ok_or_else(|| refused(FabricError::InvalidHandle { kind: "descriptor" }))?;
        let gather_user;
        let sg_list: &[Gather<'_>] = match &user {
            None => {
                gather_user = [Gather::Registered(head), Gather::Registered(head)];
                &gather_user[..1]
            }
            Some(user) => {
                gather_user = [
                    Gather::Registered(head),
                    Gather::User {
                        lkey: user.lkey,
                        data: &user.data[user.range.clone()],
                    },
                ];
                &gather_user[..]
            }
        };
        let total: usize = sg_list.iter().map(Gather::len).sum();
        let mut flags = SendFlags::SIGNALED;
        if total <= self.limits.inline_max {
            flags = flags | SendFlags::INLINE;
        }
        let qp = self.qps[(self.qp_next as usize) % NUM_QP].handle;
        let wr = SendWr {
            wr_id: u64::from(des.raw()),
            sg_list,
            ah,
            remote_qpn,
            remote_qkey: self.qkey,
            imm: None,
            flags,
        };
        self.ctx.post_send(qp, &[wr])?;
        self.qp_next = self.qp_next.wrapping_add(1);
        self.sd_wqe -= 1;
        self.stats.sends_posted += 1;
        if let Some(frag) = self.pool_mut(des).frag_mut(des) {
            frag.state = FragState::Posted;
        }
        Ok(())
    }

    /// Posts pending descriptors while credits last. A descriptor the fabric
    /// refuses completes through the send callback with the error.
    fn drain_pending(&mut self) {
        while self.sd_wqe > 0 {
            let Some(des) = self.pending.pop_front() else {
                break;
            };
            if let Some(frag) = self.pool_mut(des).frag_mut(des) {
                frag.state = FragState::Allocated;
            }
            if let Err(err) = self.post(des) {
                self.complete_send(des, Err(SendFailure::Refused(err.to_string())));
            }
        }
    }

    /// Runs the send callback for a descriptor the BTL is done with, then
    /// frees it if the BTL owns it.
    fn complete_send(&mut self, des: Descriptor, status: Result<(), SendFailure>) {
        let Some(frag) = self.pool_mut(des).frag_mut(des) else {
            return;
        };
        frag.state = FragState::Allocated;
        let event = SendEvent {
            descriptor: des,
            endpoint: EndpointId(frag.endpoint),
            context: frag.context,
            status,
        };
        let owned = frag.flags.contains(DesFlags::BTL_OWNERSHIP);
        if event.status.is_err() {
            self.stats.send_errors += 1;
        }
        if let Some(callback) = self.send_callback.as_mut() {
            callback(&event);
        }
        if owned {
            self.release(des);
        }
    }

    // ----- callbacks ----------------------------------------------------

    /// Installs the receive callback for `tag`, replacing any earlier one.
    pub fn register(&mut self, tag: Tag, callback: RecvCallback) {
        self.callbacks[usize::from(tag.0)] = Some(callback);
    }

    /// Installs the callback that reports send completions.
    pub fn set_send_callback(&mut self, callback: SendCallback) {
        self.send_callback = Some(callback);
    }

    /// Installs the error callback (`btl_register_error`).
    pub fn register_error(&mut self, callback: ErrorCallback) {
        self.error_callback = Some(callback);
    }

    // ----- progress -----------------------------------------------------

    /// Polls the completion queue once, for up to [`NUM_WC`] completions:
    /// runs send callbacks (posting one pending descriptor per returned
    /// credit) and tag callbacks, then reposts every consumed receive buffer
    /// in one call. An error completion is counted and handled in place; the
    /// rest of the batch is still processed (the seed returned at the first
    /// one and leaked the batch's receive buffers).
    ///
    /// Returns the number of completions handled.
    pub fn progress(&mut self) -> usize {
        let polled = match self.ctx.poll_cq(self.cq, &mut self.wcs) {
            Ok(n) => n,
            Err(err) => {
                self.report_error(false, format!("polling the completion queue failed: {err}"));
                return 0;
            }
        };
        if polled > 0 && self.rel.is_some() {
            // One clock read serves the whole batch.
            self.clock = reliable::now(self.epoch);
        }
        for i in 0..polled {
            let wc = self.wcs[i];
            match wc.opcode {
                WcOpcode::Send => self.on_send_completion(&wc),
                WcOpcode::Recv => self.on_receive(&wc),
            }
        }
        if let Some(rel) = self.rel.as_mut() {
            if polled > 0 {
                self.drive_reliability();
            } else if let Some(deadline) = rel.poll_timeout() {
                // An idle poll reads the clock only while a timer is armed,
                // and does work only when one is due: a truly idle endpoint
                // costs one branch per call.
                self.clock = reliable::now(self.epoch);
                if deadline <= self.clock {
                    self.drive_reliability();
                }
            }
        }
        if !self.reposts.is_empty() {
            if let Err(err) = self.ctx.post_recv(self.qps[0].handle, &self.reposts) {
                self.report_error(true, format!("reposting receive buffers failed: {err}"));
            }
            self.reposts.clear();
        }
        polled
    }

    fn on_send_completion(&mut self, wc: &WorkCompletion) {
        self.sd_wqe += 1;
        self.stats.sends_completed += 1;
        if self.rel.is_some() {
            // The datagram left (or was lost locally, which retransmission
            // repairs): the descriptor is done only when acknowledged.
            if wc.status != WcStatus::Success {
                self.stats.transmit_failures += 1;
            }
            return;
        }
        let des = Descriptor::from_raw(wc.wr_id as u32);
        let status = if wc.status == WcStatus::Success {
            Ok(())
        } else {
            Err(SendFailure::Completion(format!("{:?}", wc.status)))
        };
        self.complete_send(des, status);
        self.drain_pending();
    }

    fn on_receive(&mut self, wc: &WorkCompletion) {
        let slot = wc.wr_id as u32;
        if wc.status != WcStatus::Success {
            self.stats.recv_errors += 1;
            self.repost(slot);
            return;
        }
        let len = wc.payload_len();
        let header = self.received(slot, len).and_then(|d| {
            btl::Packet::new_checked(d)
                .and_then(|p| btl::Repr::parse(&p))
                .ok()
        });
        let Some(header) = header else {
            self.stats.recv_malformed += 1;
            self.repost(slot);
            return;
        };
        if header.job_key != self.job_key {
            self.stats.recv_bad_job_key += 1;
            self.repost(slot);
            return;
        }
        match (header.reliable, self.rel.is_some(), wc.src) {
            (true, true, Some(src)) => self.on_reliable_receive(slot, len, src),
            (false, false, Some(src)) => {
                let endpoint = self.by_addr.get(&src).copied();
                self.deliver(slot, len, btl::HEADER_LEN, header.tag, endpoint, src);
                self.repost(slot);
            }
            // A peer configured differently, or no source address.
            _ => {
                self.stats.recv_malformed += 1;
                self.repost(slot);
            }
        }
    }

    /// The datagram in receive buffer `slot` (after the GRH), if in bounds.
    fn received(&self, slot: u32, len: usize) -> Option<&[u8]> {
        let start = slot as usize * self.recv_stride + GRH_LEN;
        self.ctx
            .mr_bytes(self.recv_mr.handle)
            .ok()?
            .get(start..start + len)
    }

    /// Queues receive buffer `slot` for reposting at the end of progress.
    fn repost(&mut self, slot: u32) {
        self.reposts.push(RecvWr {
            wr_id: u64::from(slot),
            sge: Sge {
                lkey: self.recv_mr.lkey,
                offset: slot as usize * self.recv_stride,
                len: self.recv_stride,
            },
        });
    }

    /// Runs the tag callback on the payload of the datagram in `slot`, whose
    /// headers take `header_len` bytes. Does not repost the buffer.
    fn deliver(
        &mut self,
        slot: u32,
        len: usize,
        header_len: usize,
        tag: u8,
        endpoint: Option<EndpointId>,
        src: QpAddr,
    ) {
        let start = slot as usize * self.recv_stride + GRH_LEN;
        let endpoint_context = self.endpoint_context(endpoint);
        let Some(callback) = self.callbacks[usize::from(tag)].as_mut() else {
            self.stats.recv_no_callback += 1;
            return;
        };
        let Some(payload) = self
            .ctx
            .mr_bytes(self.recv_mr.handle)
            .ok()
            .and_then(|bytes| bytes.get(start + header_len..start + len))
        else {
            self.stats.recv_malformed += 1;
            return;
        };
        callback(&RecvEvent {
            tag: Tag(tag),
            endpoint,
            endpoint_context,
            src,
            payload,
        });
        self.stats.recvs_delivered += 1;
    }

    fn report_error(&mut self, fatal: bool, message: String) {
        tracing::error!(device = %self.device, port = self.port.port_num, fatal, "{message}");
        if let Some(callback) = self.error_callback.as_mut() {
            callback(&ErrorEvent { fatal, message });
        }
    }

    // ----- diagnostics and teardown -------------------------------------

    /// Sizes this module works with.
    pub const fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The port this module drives.
    pub const fn port(&self) -> &PortAttr {
        &self.port
    }

    /// The device name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Counters.
    pub const fn stats(&self) -> &ModuleStats {
        &self.stats
    }

    /// Registration cache counters.
    pub fn rcache_stats(&self) -> RegCacheStats {
        self.rcache.stats()
    }

    /// The fabric context, for its counters.
    pub const fn context(&self) -> &C {
        &self.ctx
    }

    /// Descriptors waiting for a send credit.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Send credits free.
    pub const fn send_credits(&self) -> u32 {
        self.sd_wqe
    }

    /// Checkpoint/restart notification. There is no checkpoint support, so
    /// every state is accepted and nothing happens, as in the seed.
    pub fn ft_event(&mut self, state: i32) {
        tracing::debug!(state, "ft_event ignored: no checkpoint/restart support");
    }

    /// Releases everything, in the verbs order: address handles, queue
    /// pairs, completion queue, registrations (fragments, receive buffers,
    /// cache), protection domain. Returns the fabric context.
    ///
    /// # Errors
    /// Descriptors still owned by the caller or in flight, cached
    /// registrations still referenced, or a fabric refusal: each is a leak
    /// the caller should hear about. Teardown still goes as far as it can.
    pub fn finalize(mut self) -> Result<C, (C, BtlError)> {
        let mut problems = Vec::new();
        if self.rel.is_some() {
            // Unacknowledged descriptors belong to the BTL, not the caller:
            // their peers are gone or leaving; release them.
            self.abandon_in_flight();
        }
        let live = self.send_frags.live().count() + self.user_frags.live().count();
        if live > 0 {
            problems.push(format!("{live} descriptors"));
        }
        let endpoints: Vec<EndpointId> = (0..self.endpoints.len())
            .filter(|i| self.endpoints[*i].is_some())
            .map(|i| EndpointId(i as u32))
            .collect();
        if let Err(err) = self.del_procs(&endpoints) {
            problems.push(err.to_string());
        }
        let Self {
            mut ctx,
            qps,
            cq,
            mut send_frags,
            mut user_frags,
            recv_mr,
            ack_mr,
            mut rcache,
            pd,
            ..
        } = self;
        let mut fabric = |result: Result<(), FabricError>, what: &str| {
            if let Err(err) = result {
                problems.push(format!("{what}: {err}"));
            }
        };
        for qp in qps {
            fabric(ctx.destroy_qp(qp.handle), "queue pair");
        }
        fabric(ctx.destroy_cq(cq), "completion queue");
        fabric(send_frags.release(&mut ctx), "send fragments");
        fabric(user_frags.release(&mut ctx), "user fragments");
        fabric(ctx.dereg_mr(recv_mr.handle), "receive buffers");
        fabric(ctx.dereg_mr(ack_mr.handle), "acknowledgement buffers");
        let referenced = rcache.drain(&mut ctx, deregister);
        if referenced > 0 {
            problems.push(format!("{referenced} registrations"));
        }
        if let Err(err) = ctx.dealloc_pd(pd) {
            problems.push(format!("protection domain: {err}"));
        }
        if problems.is_empty() {
            Ok(ctx)
        } else {
            Err((
                ctx,
                BtlError::Leak {
                    what: problems.join(", "),
                },
            ))
        }
    }
}

impl<C: Context> fmt::Display for Module<C> {
    /// The module's state for humans (`btl_dump`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        let rc = self.rcache.stats();
        let fabric = self.ctx.stats();
        writeln!(
            f,
            "module {}:{} ({})",
            self.device, self.port.port_num, self.port.link_layer
        )?;
        writeln!(
            f,
            "  address            {}",
            QpAddr {
                node: self.port.addr,
                qpn: self.qps[0].qp_num
            }
        )?;
        writeln!(
            f,
            "  limits             eager {} max_send {} rndv_eager {} inline {}",
            self.limits.eager_limit,
            self.limits.max_send_size,
            self.limits.rndv_eager_limit,
            self.limits.inline_max
        )?;
        writeln!(
            f,
            "  send credits       {} free, {} pending (high water {})",
            self.sd_wqe,
            self.pending.len(),
            s.pending_high_water
        )?;
        for (name, pool) in [
            ("send frags", &self.send_frags),
            ("user frags", &self.user_frags),
        ] {
            writeln!(
                f,
                "  {name:<18} {} in use of {} (max {}, high water {})",
                pool.in_use(),
                pool.len(),
                pool.max(),
                pool.high_water
            )?;
        }
        writeln!(
            f,
            "  receive buffers    {} x {} bytes",
            self.recv_count, self.recv_stride
        )?;
        writeln!(
            f,
            "  endpoints          {}",
            self.endpoints.len() - self.free_endpoints.len()
        )?;
        writeln!(
            f,
            "  sends              posted {} completed {} queued {} errors {}",
            s.sends_posted, s.sends_completed, s.sends_queued, s.send_errors
        )?;
        writeln!(
            f,
            "  receives           delivered {} malformed {} bad job key {} no callback {} errors {}",
            s.recvs_delivered,
            s.recv_malformed,
            s.recv_bad_job_key,
            s.recv_no_callback,
            s.recv_errors
        )?;
        writeln!(
            f,
            "  registration cache {} entries, {} bytes, hits {} misses {} evictions {}",
            rc.entries, rc.bytes, rc.hits, rc.misses, rc.evictions
        )?;
        if let Some(rel) = &self.rel {
            let r = rel.stats();
            writeln!(
                f,
                "  reliability        sent {} retransmitted {} (fast {}, timeouts {}) acks sent {}",
                r.sent, r.retransmitted, r.fast_retransmits, r.timeouts, r.acks_sent
            )?;
            writeln!(
                f,
                "                     received {} duplicates dropped {} out-of-order buffered {} \
                 out-of-window {} peers lost {}",
                r.received, r.duplicates, r.out_of_order, r.out_of_window, r.peers_lost
            )?;
            writeln!(
                f,
                "                     bad checksum {} unknown peer {} bad job key {} unacknowledged {}",
                s.recv_bad_checksum,
                s.recv_unknown_peer,
                s.recv_bad_job_key,
                self.unacknowledged()
            )?;
            let rtos: Vec<std::time::Duration> = (0..self.endpoints.len())
                .filter(|i| self.endpoints[*i].is_some())
                .filter_map(|i| rel.rto(udbtl_reliability::PeerId(i as u32)))
                .collect();
            if let (Some(min), Some(max)) = (rtos.iter().min(), rtos.iter().max()) {
                writeln!(
                    f,
                    "                     rto {min:?} to {max:?} over {} peers",
                    rtos.len()
                )?;
            }
        }
        write!(
            f,
            "  fabric             tx {} rx {} dropped: no buffer {} bad qkey {} malformed {} too long {} kernel {}",
            fabric.tx_datagrams,
            fabric.rx_datagrams,
            fabric.rx_no_buffer,
            fabric.rx_bad_qkey,
            fabric.rx_malformed,
            fabric.rx_too_long,
            fabric.tx_kernel_drops
        )
    }
}
