//! Bringing a module up in the seed's order, unwinding a failed start, and
//! tearing it down in the verbs order.

use udbtl_fabric::{
    Context, FabricError, Mr, PdHandle, PortAttr, QpCap, QpInfo, QpInitAttr, QpTransition, RecvWr,
};
use udbtl_wire::datagram::AuthKey;
use udbtl_wire::modex;

use super::bounce::BouncePool;
use super::descriptors::{Frags, USER_FRAG_STRIDE};
use super::endpoints::{Endpoints, module_address};
use super::integrity::Integrity;
use super::limits::{
    FRAG_ALIGN, INLINE_REQUEST, Limits, header_len, limits_for, recv_buffer_len, recv_pool_size,
    round_up, send_frags_bound,
};
use super::recv::{RecvPool, recv_work_request};
use super::reliable::{Coalescer, Reliable, RingLayout};
use super::transmit::TransmitQueue;
use super::{Engine, ModuleStats, Path, deregister};
use crate::error::BtlError;
use crate::frag::{FragKind, FragPool};
use crate::params::Params;
use crate::rcache::RegCache;
use crate::{EndpointId, NUM_QP};

/// Resources created so far by module initialisation, released in reverse
/// order if a later step fails.
#[derive(Default)]
struct Partial {
    pd: Option<PdHandle>,
    cq: Option<udbtl_fabric::CqHandle>,
    qps: Vec<QpInfo>,
    recv_mr: Option<Mr>,
    ack_mr: Option<Mr>,
    send_frags: Option<FragPool>,
    user_frags: Option<FragPool>,
}

impl Partial {
    fn unwind<C: Context>(self, ctx: &mut C) {
        for mut pool in [self.send_frags, self.user_frags].into_iter().flatten() {
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

/// A reliable module's stream nonce (`modex::Address::stream_nonce`): from
/// the operating system's randomness, so that no one outside the job can
/// tell where its streams start.
fn stream_nonce() -> Result<u32, BtlError> {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).map_err(BtlError::Randomness)?;
    Ok(u32::from_ne_bytes(bytes))
}

/// What datagrams to a module must carry (`modex::Admission`): drawn at
/// random, unless `ib_qkey` fixes the Q_Key, which also leaves the job key
/// unmasked, as the seed's modules were.
fn admission(params: &Params) -> Result<modex::Admission, BtlError> {
    if params.ib_qkey != 0 {
        return Ok(modex::Admission {
            qkey: params.ib_qkey,
            job_key_mask: 0,
        });
    }
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(BtlError::Randomness)?;
    Ok(modex::Admission::from_random(bytes))
}

/// How a reliable module on `port` with queue pairs `qps`, stream nonce
/// `stream_nonce` and `admission` protects its datagrams: sealed with `auth` (under a key
/// derived from the job secret and the module's address when there is a
/// job secret, else a random one), else a checksum unless the fabric checks
/// integrity end to end.
fn integrity_for(
    params: &Params,
    port: &PortAttr,
    qps: &[QpInfo],
    stream_nonce: u32,
    admission: modex::Admission,
) -> Result<Integrity, BtlError> {
    if let Some(protection) = params.protection() {
        // Receives are posted on queue pair 0: the one peers address.
        let own_qpn = qps.first().map_or(0, |qp| qp.qp_num);
        return Ok(match params.auth_secret {
            Some(job) => {
                let address =
                    module_address(port, qps, 0, modex::Auth::Derived, stream_nonce, admission);
                Integrity::Sealed {
                    own: modex::derive_receive_key(&job, &address),
                    own_qpn,
                    job: Some(job),
                    protection,
                }
            }
            None => {
                let mut key = [0u8; modex::KEY_LEN];
                getrandom::fill(&mut key).map_err(BtlError::Randomness)?;
                Integrity::Sealed {
                    own: AuthKey(key),
                    own_qpn,
                    job: None,
                    protection,
                }
            }
        });
    }
    // Only InfiniBand's ICRC covers a datagram end to end. UDP's 16-bit
    // checksum is weak, optional, and not verified on loopback at all; the
    // simulator corrupts on purpose.
    let fabric_checks_integrity = port.link_layer == "infiniband";
    let checksum = match params.checksum.as_str() {
        "on" => true,
        "off" => false,
        _ => !fabric_checks_integrity,
    };
    Ok(if checksum {
        Integrity::Checksum
    } else {
        Integrity::Fabric
    })
}

/// What `Engine::build` found out besides the resources.
struct Built {
    port: PortAttr,
    limits: Limits,
    admission: modex::Admission,
    recv_stride: usize,
    recv_count: usize,
}

impl<C: Context> Engine<C> {
    /// Builds a module on `port` of an opened device, in the seed's order:
    /// protection domain, registration cache, completion queue of depth
    /// `rd_num + sd_num`, [`NUM_QP`] queue pairs moved to RTS, `rd_num`
    /// receive buffers posted at once, then the send and user free lists.
    /// A failure unwinds what was built, in reverse, and hands the context
    /// back with the error.
    ///
    /// # Errors
    /// The failing step and its verbs error.
    pub(super) fn new(mut ctx: C, port: u8, params: &Params) -> Result<Self, (C, BtlError)> {
        let mut partial = Partial::default();
        match Self::build(&mut ctx, port, params, &mut partial) {
            Ok(built) => match Self::assemble(ctx, partial, built, params) {
                Ok(module) => Ok(module),
                Err((mut ctx, partial, err)) => {
                    partial.unwind(&mut ctx);
                    Err((ctx, err))
                }
            },
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
        let admission = admission(params)?;
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
                qkey: admission.qkey,
                port: port_num,
            };
            ctx.modify_qp(qp.handle, &init)
                .map_err(fail("move queue pair to INIT"))?;
            ctx.modify_qp(qp.handle, &QpTransition::Rtr)
                .map_err(fail("move queue pair to RTR"))?;
            ctx.modify_qp(qp.handle, &QpTransition::Rts { sq_psn: 0 })
                .map_err(fail("move queue pair to RTS"))?;
        }
        // The longest datagram: headers and the longest payload.
        let max_datagram = header_len(params) + limits.max_send_size;
        let recv_stride = recv_buffer_len(max_datagram);
        let recv_count = recv_pool_size(params, recv_stride);
        let recv_mr = ctx
            .reg_mr(pd, recv_count * recv_stride)
            .map_err(fail("register receive buffers"))?;
        partial.recv_mr = Some(recv_mr);
        // Receives are posted on queue pair 0 only: it is the one published.
        let wrs: Vec<RecvWr> = (0..recv_count as u32)
            .map(|slot| recv_work_request(recv_mr, recv_stride, slot))
            .collect();
        ctx.post_recv(partial.qps[0].handle, &wrs)
            .map_err(|e| fail("post receive buffers")(e.error))?;
        if params.reliable {
            let ack_mr = ctx
                .reg_mr(
                    pd,
                    RingLayout::new(params, max_datagram, ctx.device()).bytes(),
                )
                .map_err(fail("register acknowledgement buffers"))?;
            partial.ack_mr = Some(ack_mr);
        }
        let send_stride = round_up(header_len(params) + limits.eager_limit, FRAG_ALIGN);
        let increment = (params.sd_num as usize >> 1).max(1);
        // Each list starts with one chunk; it is kept even if its first
        // growth fails, so that the unwind releases what it registered.
        let mut pool = |kind, stride, max: usize, slot: &mut Option<FragPool>| {
            let mut pool = FragPool::new(kind, stride, increment, max.max(increment));
            let grown = pool.grow(ctx, pd, increment);
            *slot = Some(pool);
            grown
        };
        let send_frags_max = send_frags_bound(params, send_stride).max(increment);
        pool(
            FragKind::Send,
            send_stride,
            send_frags_max,
            &mut partial.send_frags,
        )
        .map_err(fail("register send fragments"))?;
        pool(
            FragKind::User,
            USER_FRAG_STRIDE,
            params.user_frags_max,
            &mut partial.user_frags,
        )
        .map_err(fail("register user fragments"))?;
        Ok(Built {
            port,
            limits: Limits {
                inline_max,
                recv_buffers: recv_count,
                recv_buffer_len: recv_stride,
                send_frags_max,
                ..limits
            },
            admission,
            recv_stride,
            recv_count,
        })
    }

    #[allow(clippy::result_large_err)]
    fn assemble(
        ctx: C,
        partial: Partial,
        built: Built,
        params: &Params,
    ) -> Result<Self, (C, Partial, BtlError)> {
        let missing = BtlError::Leak {
            what: "a resource initialisation did not create".into(),
        };
        let Partial {
            pd: Some(pd),
            cq: Some(cq),
            recv_mr: Some(recv_mr),
            send_frags: Some(send_frags),
            user_frags: Some(user_frags),
            ack_mr,
            qps,
        } = partial
        else {
            return Err((ctx, partial, missing));
        };
        let path = match ack_mr {
            Some(ack_mr) => {
                let made = stream_nonce().and_then(|nonce| {
                    let integrity =
                        integrity_for(params, &built.port, &qps, nonce, built.admission)?;
                    let max_datagram = header_len(params) + built.limits.max_send_size;
                    let ring = RingLayout::new(params, max_datagram, ctx.device());
                    Reliable::new(
                        params,
                        built.limits.max_send_size,
                        (ack_mr, ring),
                        integrity,
                        nonce,
                    )
                    .map_err(BtlError::from)
                });
                match made {
                    Ok(reliable) => Path::Reliable(reliable),
                    Err(err) => {
                        let partial = Partial {
                            pd: Some(pd),
                            cq: Some(cq),
                            recv_mr: Some(recv_mr),
                            send_frags: Some(send_frags),
                            user_frags: Some(user_frags),
                            ack_mr: Some(ack_mr),
                            qps,
                        };
                        return Err((ctx, partial, err));
                    }
                }
            }
            None => Path::Unreliable,
        };
        let qp_handles = qps.iter().map(|qp| qp.handle).collect();
        let tx = TransmitQueue::new(qp_handles, built.limits.inline_max, params.sd_num);
        Ok(Self {
            device: ctx.device().name.clone(),
            recv: RecvPool::new(recv_mr, built.recv_stride, built.recv_count, qps[0].handle),
            ctx,
            port: built.port,
            pd,
            cq,
            qps,
            tx,
            frags: Frags {
                send: send_frags,
                user: user_frags,
                bounce: bounce_pool(params, &built.limits),
            },
            rcache: RegCache::new(
                params.rcache_max_entries,
                params.rcache_max_bytes,
                params.mpool != "none",
            ),
            endpoints: Endpoints::default(),
            notices: std::collections::VecDeque::new(),
            held_for_app: 0,
            app_present: true,
            limits: built.limits,
            job_key: params.job_key,
            admission: built.admission,
            foreign_job_keys: Vec::new(),
            sl: params.ib_service_level,
            path_bits: params.ib_src_path_bits,
            stats: ModuleStats::default(),
            header_len: header_len(params),
            coalescer: Coalescer::new(params.coalesce, built.limits.eager_limit),
            host_split: None,
            proc_id: super::reliable::random_process_id(),
            reads: super::read::Reads::new(
                u64::from(super::reliable::random_process_id()) << 32,
                super::read::TargetCopy::from_param(&params.read_copy),
            ),
            path,
        })
    }

    /// Releases everything, in the verbs order: address handles, queue
    /// pairs, completion queue, registrations (fragments, receive buffers,
    /// cache), protection domain. Returns the fabric context.
    ///
    /// # Errors
    /// Descriptors still owned by the caller, cached registrations still
    /// referenced, or a fabric refusal: each is a leak the caller should
    /// hear about. Teardown still goes as far as it can.
    pub(super) fn finalize(mut self) -> Result<C, (C, BtlError)> {
        let mut problems = Vec::new();
        // Descriptors the BTL still owns (unacknowledged, or waiting for a
        // credit) are its own to release: their peers are gone or leaving.
        self.tx.sends.clear();
        for des in self.frags.owned_by_btl() {
            self.release(des);
        }
        self.deregister_regions();
        let live = self.frags.live();
        if live > 0 {
            problems.push(format!("{live} descriptors"));
        }
        let endpoints: Vec<EndpointId> = self.endpoints.ids().collect();
        if let Err(err) = self.del_procs(&endpoints) {
            problems.push(err.to_string());
        }
        let Self {
            mut ctx,
            qps,
            cq,
            mut frags,
            recv,
            path,
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
        fabric(frags.send.release(&mut ctx), "send fragments");
        fabric(frags.user.release(&mut ctx), "user fragments");
        fabric(ctx.dereg_mr(recv.mr.handle), "receive buffers");
        if let Path::Reliable(reliable) = path {
            fabric(
                ctx.dereg_mr(reliable.ack_ring_handle()),
                "acknowledgement buffers",
            );
        }
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

/// The bounce buffers for `alloc`s longer than a datagram: none where the
/// limits allow no such alloc; otherwise as many as fit `send_mem`.
fn bounce_pool(params: &Params, limits: &Limits) -> BouncePool {
    if limits.alloc_limit <= limits.eager_limit {
        return BouncePool::new(0, 0);
    }
    let size = limits.alloc_limit;
    BouncePool::new(size, (params.send_mem / size).max(16))
}
