//! A BTL module: one active port, its queue pairs, its receive pool, its
//! fragments and its endpoints.
//!
//! The public [`Module`] (`handle/`) is a handle on the module's state,
//! the `Engine`, which sits behind a lock so that the progress helper
//! (`helper.rs`) can service the fabric while the application is away; the
//! caller's callbacks stay with the handle and run only in the caller's own
//! calls. The engine's work is split by job, one file each:
//!
//! * `build.rs`: bringing it up in the seed's order, its [`Limits`], and
//!   tearing it down in the verbs order;
//! * `endpoints.rs`: the peers, the index from a sender's address to its
//!   endpoint, and the route (address handle, queue pair) to each;
//! * `descriptors.rs`: `alloc`, `prepare_src`, segments and `free`;
//! * `send.rs`: send credits, the one queue of sends waiting for them, and
//!   posting;
//! * `recv.rs`: the receive pool, header checks, dispatch, reposting;
//! * `reliable/`: the drive of the sans-IO reliability state (`mod.rs`),
//!   the reliable part's own state (`state.rs`: the reliability core, the
//!   acknowledgement ring, unknown senders) and coalescing
//!   (`coalesce.rs`); `integrity.rs`: sealing and checking datagrams;
//!   `messages.rs`: multi-datagram messages, cut and reassembled;
//!   `wait.rs`: waiting with a deadline on the fabric's clock;
//! * `events.rs`: what callbacks receive, and the notices queued for them;
//!   `host.rs`: the same as events, for hosts that run their callbacks
//!   themselves with the module unlocked;
//!   `stats.rs`: counters and the dump.
//!
//! This file holds the engine's type, `send`, posting, and one pass of the
//! drive loop.

/// The [`Poster`](send::Poster) of a module, from its fields (so that the
/// context can be borrowed mutably beside it).
macro_rules! poster {
    ($module:expr) => {
        $crate::module::send::Poster {
            qps: &$module.qp_handles,
            qkey: $module.qkey,
            inline_max: $module.limits.inline_max,
        }
    };
}

mod build;
mod deliver;
mod delivery;
mod descriptors;
mod endpoints;
mod events;
mod handle;
mod helper;
mod integrity;
mod limits;
mod messages;
mod recv;
mod reliable;
mod send;
mod stats;
mod wait;

use std::collections::VecDeque;

use udbtl_fabric::{
    Context, CqHandle, FabricError, Gather, Mr, PdHandle, PortAttr, PostError, QpHandle, QpInfo,
    WcOpcode, WcStatus, WorkCompletion,
};
use udbtl_reliability::Instant;
use udbtl_wire::btl;

pub use deliver::{HostEvent, Polled, Received};
pub use events::{
    ErrorCallback, ErrorEvent, RecvCallback, RecvEvent, SendCallback, SendEvent, SendStatus,
};
pub use handle::{Module, Segment, SendArgs};
pub use limits::{Limits, USER_RESERVE_MAX, recv_buffer_len};
pub use stats::ModuleStats;

use crate::error::{BtlError, SendFailure};
use crate::frag::{DesFlags, Descriptor, FragState};
use crate::rcache::RegCache;
use crate::{EndpointId, Tag};
use descriptors::{Frags, bad};
pub use endpoints::AddProcs;
use endpoints::Endpoints;
use events::Notice;
use recv::RecvPool;
use reliable::Reliable;
use send::{PostBatch, SendQueue, WaitingSend};

/// A module's state: everything but the caller's callbacks. The [`Module`]
/// handle keeps it behind a lock, so that a helper thread can service the
/// fabric while the application is away; callbacks never run on the helper,
/// so what must reach them waits in `notices`.
struct Engine<C: Context> {
    ctx: C,
    device: String,
    port: PortAttr,
    pd: PdHandle,
    cq: CqHandle,
    qps: Vec<QpInfo>,
    qp_handles: Vec<QpHandle>,
    limits: Limits,
    frags: Frags,
    rcache: RegCache,
    endpoints: Endpoints,
    sends: SendQueue,
    /// Datagrams queued while the send side is flushed, posted together.
    batch: PostBatch,
    /// Sends leave the reliability state only at the next flush: set while
    /// the datagrams of one message are handed over, so that they are
    /// posted in batches.
    defer_transmits: bool,
    recv: RecvPool,
    /// Sequencing, acknowledgement and retransmission; `None` when
    /// `reliable` is off.
    reliable: Option<Reliable>,
    /// What the caller's callbacks must hear, oldest first.
    notices: VecDeque<Notice>,
    /// Receive buffers held by `notices` until the application's callback
    /// has seen them.
    held_for_app: usize,
    /// The application is the one calling (its progress), rather than the
    /// helper servicing the fabric while it is away.
    app_present: bool,
    stats: ModuleStats,
    qkey: u32,
    job_key: u32,
    /// Keys of other jobs whose processes were added as peers (dynamic
    /// processes: spawn, connect/accept); their datagrams are accepted from
    /// those peers only. Usually empty.
    foreign_job_keys: Vec<u32>,
    /// Service level put into every address handle.
    sl: u8,
    /// Source path bits put into every address handle.
    path_bits: u8,
    /// BTL header bytes in front of every payload: 8, plus the 32-byte
    /// reliability extension when reliable.
    header_len: usize,
    /// Small messages may ride in the datagram of an earlier one to the
    /// same peer (the `coalesce` parameter; `reliable/coalesce.rs`).
    coalesce: bool,
    /// A rider's bytes on their way into its carrier (both live in
    /// registered memory, possibly of one registration): reserved once, at
    /// the eager limit, so that coalescing never allocates.
    coalesce_scratch: Vec<u8>,
    /// Messages riding in another's datagram, not yet completed: the
    /// reliability state counts only the carriers.
    riders_waiting: usize,
    /// A small message sent in a burst (no progress call since the previous
    /// send), held back so that the burst's next small messages to the same
    /// peer ride in its datagram. It reaches the reliability state at the
    /// next progress call, or at the first send it cannot carry.
    open_carrier: Option<Descriptor>,
    /// A send was made since the last progress call: the next small one is
    /// part of a burst.
    sent_since_progress: bool,
    /// A coalesced datagram whose records a host is being handed one by
    /// one (`host.rs`): the delivery, the offset of the next record in its
    /// payload, and how many records remain.
    host_split: Option<(delivery::Delivery, usize, usize)>,
    /// This process's id, published in the modex and carried in reliable
    /// datagrams.
    proc_id: u32,
}

impl<C: Context> std::fmt::Debug for Engine<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("device", &self.device)
            .field("port", &self.port.port_num)
            .field("limits", &self.limits)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Deregisters memory the registration cache evicted. A refusal can only
/// mean the registration is already gone, so it is logged, not raised.
fn deregister<C: Context>(ctx: &mut C, mr: Mr) {
    if let Err(err) = ctx.dereg_mr(mr.handle) {
        tracing::warn!(%err, "deregistering evicted memory failed");
    }
}

impl<C: Context> Engine<C> {
    // ----- sending ------------------------------------------------------

    /// The engine's side of `Module::send`, whose documentation is the
    /// contract.
    pub(super) fn send(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
        tag: Tag,
    ) -> Result<SendStatus, BtlError> {
        if self.endpoints.get(endpoint).is_none() {
            return Err(BtlError::BadEndpoint {
                endpoint: endpoint.0,
            });
        }
        let frag = self.frags.checked_mut(des)?;
        if frag.state != FragState::Allocated {
            return Err(bad(des, "already being sent"));
        }
        frag.endpoint = endpoint.0;
        frag.tag = tag.0;
        self.stats.messages_sent += 1;
        let header = btl::Repr {
            tag: tag.0,
            job_key: self.job_key,
            reliable: self.reliable.is_some(),
        };
        header.emit(&mut btl::Packet::new_unchecked(self.registered_mut(des)?));
        if self.reliable.is_some() {
            return self.send_reliable(endpoint, des);
        }
        if !self.sends.can_post() {
            if let Some(frag) = self.frags.get_mut(des) {
                frag.state = FragState::Pending;
            }
            self.sends.push(WaitingSend { des, header: None });
            self.stats.sends_queued += 1;
            self.stats.pending_high_water = self.sends.high_water;
            return Ok(SendStatus::Queued);
        }
        self.post_descriptor(des).map_err(|source| BtlError::Post {
            endpoint: endpoint.0,
            source,
        })?;
        Ok(SendStatus::Posted)
    }

    /// Posts one descriptor on its endpoint's route, taking a send credit.
    /// On failure no credit is taken and the descriptor's state is
    /// unchanged.
    fn post_descriptor(&mut self, des: Descriptor) -> Result<(), PostError> {
        let refused = |kind| PostError {
            posted: 0,
            error: FabricError::InvalidHandle { kind },
        };
        let frag = self.frags.get(des).ok_or_else(|| refused("descriptor"))?;
        let route = self
            .endpoints
            .route(EndpointId(frag.endpoint))
            .ok_or_else(|| refused("endpoint"))?;
        let (_, head) = self
            .frags
            .head(des, self.header_len + frag.seg_len)
            .ok_or_else(|| refused("descriptor"))?;
        let gathers = [
            Gather::Registered(head),
            match &frag.user {
                Some(user) => Gather::User {
                    lkey: user.lkey,
                    data: &user.data.bytes()[user.range.clone()],
                },
                None => Gather::Registered(head),
            },
        ];
        let sg_list = &gathers[..if frag.user.is_some() { 2 } else { 1 }];
        poster!(self).post(&mut self.ctx, &route, sg_list, u64::from(des.raw()), true)?;
        self.sends.take_credit();
        self.stats.sends_posted += 1;
        if let Some(frag) = self.frags.get_mut(des) {
            frag.state = FragState::Posted;
        }
        Ok(())
    }

    /// Posts waiting sends while credits last. An unreliable send the
    /// fabric refuses completes through the send callback with the error; a
    /// reliable one is a loss that retransmission repairs.
    fn post_waiting(&mut self) {
        while let Some(waiting) = self.sends.pop_ready() {
            match waiting.header {
                Some(header) => self.transmit_data(waiting.des, header),
                None => {
                    if let Some(frag) = self.frags.get_mut(waiting.des) {
                        frag.state = FragState::Allocated;
                    }
                    if let Err(err) = self.post_descriptor(waiting.des) {
                        self.complete_send(waiting.des, Err(SendFailure::Refused(err.to_string())));
                    }
                }
            }
        }
    }

    /// Runs the send callback for a descriptor the BTL is done with, then
    /// frees it if the BTL owns it.
    fn complete_send(&mut self, des: Descriptor, status: Result<(), SendFailure>) {
        let Some(frag) = self.frags.get_mut(des) else {
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
        self.notices.push_back(Notice::Sent { event, owned });
    }

    fn report_error(&mut self, endpoint: Option<EndpointId>, fatal: bool, message: String) {
        tracing::error!(device = %self.device, port = self.port.port_num, fatal, "{message}");
        self.notices.push_back(Notice::Error(ErrorEvent {
            fatal,
            endpoint,
            message,
        }));
    }

    // ----- progress -----------------------------------------------------

    /// One pass of the drive loop: reads the fabric's clock, polls the
    /// completion queue once (up to [`NUM_WC`](crate::NUM_WC) completions),
    /// handles them, fires the reliability timers that are due, sends what
    /// is owed and reposts consumed buffers. What the callbacks must hear is
    /// queued in `notices`. `app_present` says whether the application is
    /// the caller (its own progress) or the helper is servicing the fabric
    /// while it is away, which decides whether an in-order datagram may be
    /// taken without room to keep it.
    pub(super) fn progress(&mut self, app_present: bool) -> usize {
        self.app_present = app_present;
        // Before polling: a timer must never fire on a clock read after an
        // empty poll, while what would have stopped it sits unread. An
        // unreliable module has no timers and reads no clock.
        let now = if self.reliable.is_some() {
            let now = self.clock();
            self.note_running(now);
            // A burst is over: its held-back datagram leaves before the poll.
            self.sent_since_progress = false;
            if self.close_open_carrier(now) {
                self.flush_transmits(now);
            }
            now
        } else {
            Instant::ZERO
        };
        let polled = match self.ctx.poll_cq(self.cq, &mut self.recv.wcs) {
            Ok(n) => n,
            Err(err) => {
                self.report_error(
                    None,
                    false,
                    format!("polling the completion queue failed: {err}"),
                );
                0
            }
        };
        for i in 0..polled {
            let wc = self.recv.wcs[i];
            match wc.opcode {
                WcOpcode::Send => self.on_send_completion(&wc),
                WcOpcode::Recv => self.on_receive(&wc, now),
            }
        }
        if let Some(reliable) = self.reliable.as_mut() {
            // An idle poll with no timer due costs one comparison.
            if polled > 0 || reliable.core.poll_timeout().is_some_and(|at| at <= now) {
                // A full batch may have left completions in the fabric.
                let drained = polled < self.recv.wcs.len();
                self.drive_reliability(now, drained);
            }
        } else if polled > 0 {
            self.post_waiting();
        }
        self.flush_reposts();
        polled
    }

    /// Reposts the buffers consumed since the last flush, in one call.
    fn flush_reposts(&mut self) {
        if let Err(err) = self.recv.flush(&mut self.ctx) {
            self.report_error(
                None,
                true,
                format!("reposting receive buffers failed: {err}"),
            );
        }
    }

    fn on_send_completion(&mut self, wc: &WorkCompletion) {
        self.sends.return_credit();
        self.stats.sends_completed += 1;
        if self.reliable.is_some() {
            // The datagram left (or was lost locally, which retransmission
            // repairs): the descriptor is done only when acknowledged.
            if wc.status != WcStatus::Success {
                self.stats.transmit_failures += 1;
            }
            return;
        }
        let status = if wc.status == WcStatus::Success {
            Ok(())
        } else {
            Err(SendFailure::Completion(format!("{:?}", wc.status)))
        };
        self.complete_send(Descriptor::from_raw(wc.wr_id as u32), status);
    }

    /// The engine's side of `Module::next_deadline`, whose documentation is the
    /// contract.
    pub(super) fn next_deadline(&mut self) -> Option<std::time::Duration> {
        let at = self.reliable.as_mut()?.core.poll_timeout()?;
        Some(std::time::Duration::from_nanos(at.as_nanos()))
    }
}
