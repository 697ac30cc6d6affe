//! A BTL module: one active port, its queue pairs, its receive pool, its
//! fragments and its endpoints.
//!
//! The public [`Module`] (`handle/`) is a handle on the module's state,
//! the `Engine`, which sits behind a lock so that the progress helper
//! (`helper.rs`) can service the fabric while the application is away; the
//! caller's callbacks stay with the handle and run only in the caller's own
//! calls. The engine's work is split by job, one file each, from a send's
//! way down to a delivery's way up:
//!
//! * `handle/`: the [`Module`] callers hold, and the one delivery loop that
//!   runs their callbacks;
//! * this file: the engine's type, `send` and one pass of the drive loop,
//!   each matching the module's [`Path`] (unreliable or reliable) once;
//! * `reliable/`: the drive of the sans-IO reliability state (`mod.rs`:
//!   sequencing, timers, events), its reliable receive path (`receive.rs`),
//!   the reliable part's own state (`state.rs`) and coalescing
//!   (`coalesce.rs`: the `Coalescer`);
//! * `outgoing.rs`: a descriptor or acknowledgement becomes a datagram,
//!   stamped and sealed (`integrity.rs`), and goes to
//! * `transmit.rs`: the transmit queue: send credits, the sends waiting for
//!   them, batches, and posting on the fabric;
//! * `recv.rs`: the receive pool, header checks and dispatch;
//! * `deliver.rs`: what the caller must hear, queued and handed out one
//!   event at a time (`delivery.rs`: a received datagram on its way);
//!   `events.rs`: the events and callbacks themselves;
//! * `messages.rs`: multi-datagram messages, cut and reassembled;
//! * `read/`: remote reads (the BTL interface's `get`): requests, and
//!   replies sent from registered memory and copied straight to their
//!   destination;
//! * `endpoints.rs`: the peers, the index from a sender's address to its
//!   endpoint, and the route (address handle, queue pair) to each;
//! * `descriptors.rs`: `alloc`, `prepare_src`, segments and `free`;
//!   `bounce.rs`: the buffers of `alloc`s longer than a datagram;
//! * `build.rs`: bringing a module up in the seed's order and tearing it
//!   down in the verbs order; `limits.rs`: the sizes it works with
//!   ([`Limits`], the header layout);
//! * `helper.rs`: the progress thread; `wait.rs`: waiting with a deadline on
//!   the fabric's clock; `stats.rs`: counters and the dump.

mod bounce;
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
mod outgoing;
mod read;
mod recv;
mod reliable;
mod seal;
mod stats;
mod transmit;
mod wait;

use std::collections::VecDeque;

use udbtl_fabric::{
    Context, CqHandle, Mr, PdHandle, PortAttr, QpInfo, WcOpcode, WcStatus, WorkCompletion,
};
use udbtl_reliability::Instant;
use udbtl_wire::{btl, modex};

pub use deliver::{HostEvent, Polled, Received};
pub use events::{
    ErrorCallback, ErrorEvent, RecvCallback, RecvEvent, SendCallback, SendEvent, SendStatus,
};
pub use handle::{Module, Segment, SendArgs};
pub use limits::{Limits, USER_RESERVE_MAX, recv_buffer_len};
pub use read::{ReadCallback, ReadEvent, ReadFailure, ReadTarget, Region, RegionKey, RemoteRange};
pub use stats::ModuleStats;

use crate::error::{BtlError, SendFailure};
use crate::frag::{Descriptor, FragState};
use crate::rcache::RegCache;
use crate::{EndpointId, Tag};
use descriptors::{Frags, bad};
pub use endpoints::AddProcs;
use endpoints::Endpoints;
use events::Notice;
use read::Reads;
use recv::RecvPool;
use reliable::{Coalescer, Reliable};
use transmit::{TransmitQueue, WaitingSend};

/// How a module carries datagrams, chosen at build time (the `reliable`
/// parameter).
#[derive(Debug)]
// One per module, inside the engine: boxing the large variant would only add
// a pointer to follow on every reliable call.
#[allow(clippy::large_enum_variant)]
enum Path {
    /// As the fabric delivers them: no sequence, no acknowledgement.
    Unreliable,
    /// Sequenced, acknowledged and retransmitted, exactly once and in order.
    Reliable(Reliable),
}

impl Path {
    const fn reliable(&self) -> Option<&Reliable> {
        match self {
            Self::Reliable(reliable) => Some(reliable),
            Self::Unreliable => None,
        }
    }

    const fn reliable_mut(&mut self) -> Option<&mut Reliable> {
        match self {
            Self::Reliable(reliable) => Some(reliable),
            Self::Unreliable => None,
        }
    }

    const fn is_reliable(&self) -> bool {
        matches!(self, Self::Reliable(_))
    }
}

/// Whether a send's datagrams leave at once, or at the next flush (the
/// pieces of one message, which leave together, in batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flush {
    Now,
    Later,
}

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
    limits: Limits,
    frags: Frags,
    rcache: RegCache,
    endpoints: Endpoints,
    /// Send credits, the sends waiting for them, and posting.
    tx: TransmitQueue,
    recv: RecvPool,
    /// Unreliable, or reliable with its sequencing, acknowledgement and
    /// retransmission state.
    path: Path,
    /// What the caller's callbacks must hear, oldest first.
    notices: VecDeque<Notice>,
    /// Receive buffers held by `notices` until the application's callback
    /// has seen them.
    held_for_app: usize,
    /// The application is the one calling (its progress), rather than the
    /// helper servicing the fabric while it is away.
    app_present: bool,
    stats: ModuleStats,
    job_key: u32,
    /// What datagrams to this module must carry: its queue pairs' Q_Key,
    /// and the mask peers XOR into the job key.
    admission: modex::Admission,
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
    /// Small messages riding in the datagram of an earlier one to the same
    /// peer (the `coalesce` parameter; `reliable/coalesce.rs`).
    coalescer: Coalescer,
    /// A coalesced datagram whose records the caller is being handed one
    /// by one (`deliver.rs`): the delivery, the offset of the next record in its
    /// payload, and how many records remain.
    host_split: Option<(delivery::Delivery, usize, usize)>,
    /// This process's id, published in the modex and carried in reliable
    /// datagrams.
    proc_id: u32,
    /// Remote reads: the regions peers may read, the reads asked for, the
    /// requests waiting to be served.
    reads: Reads,
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
        self.send_as(endpoint, des, tag, Flush::Now)
    }

    /// [`send`](Self::send), leaving a reliable send's datagrams for the
    /// next flush when `flush` says so.
    fn send_as(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
        tag: Tag,
        flush: Flush,
    ) -> Result<SendStatus, BtlError> {
        let Some(peer_job_key) = self.endpoints.get(endpoint).map(|e| e.header_job_key) else {
            return Err(BtlError::BadEndpoint {
                endpoint: endpoint.0,
            });
        };
        let frag = self.frags.checked_mut(des)?;
        if frag.state != FragState::Allocated {
            return Err(bad(des, "already being sent"));
        }
        frag.endpoint = endpoint.0;
        frag.tag = tag.0;
        self.stats.messages_sent += 1;
        let header = btl::Repr {
            tag: tag.0,
            job_key: peer_job_key,
            reliable: self.path.is_reliable(),
        };
        header.emit(&mut btl::Packet::new_unchecked(self.registered_mut(des)?));
        if self.path.is_reliable() {
            return self.send_reliable(endpoint, des, flush);
        }
        if !self.tx.sends.can_post() {
            if let Some(frag) = self.frags.get_mut(des) {
                frag.state = FragState::Pending;
            }
            self.tx.sends.push(WaitingSend {
                des,
                header: None,
                resend: false,
            });
            self.stats.sends_queued += 1;
            self.stats.pending_high_water = self.tx.sends.high_water;
            return Ok(SendStatus::Queued);
        }
        self.post_descriptor(des).map_err(|source| BtlError::Post {
            endpoint: endpoint.0,
            source,
        })?;
        Ok(SendStatus::Posted)
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
        // Acknowledgements held back for a reply at the last call go now,
        // unless the reply carried them.
        let released = self
            .path
            .reliable_mut()
            .is_some_and(|r| r.core.release_acks());
        let held_before = self.held_for_app;
        let now = if self.path.is_reliable() {
            let now = self.clock();
            self.note_running(now);
            // A burst is over: what it held back leaves before the poll.
            self.coalescer.end_burst();
            if self.close_open_carrier(now) || self.coalescer.holds() {
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
        // Data for the caller arrived: it is likely to reply before its next
        // call, and the reply carries what this call would send as an
        // acknowledgement of its own (the helper thread never replies).
        let reply_likely = app_present && self.held_for_app > held_before;
        if let Some(reliable) = self.path.reliable_mut() {
            if reply_likely {
                reliable.core.hold_acks();
            }
            // An idle poll with no timer due costs one comparison.
            if polled > 0 || released || reliable.core.poll_timeout().is_some_and(|at| at <= now) {
                // A full batch may have left completions in the fabric.
                let drained = polled < self.recv.wcs.len();
                self.drive_reliability(now, drained);
            }
        } else if polled > 0 {
            self.post_waiting();
        }
        if self.reads.has_waiting() {
            self.serve_reads();
        }
        if self.reads.has_unsent() {
            self.send_read_requests();
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
        self.tx.sends.return_credit();
        self.stats.sends_completed += 1;
        if self.path.is_reliable() {
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
        let at = self.path.reliable_mut()?.core.poll_timeout()?;
        Some(std::time::Duration::from_nanos(at.as_nanos()))
    }
}
