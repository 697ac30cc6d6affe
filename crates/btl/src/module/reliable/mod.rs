//! The reliable path: drives the sans-IO reliability state with what the
//! fabric delivers. Each progress call hands it every received header
//! (taking the buffers it makes deliverable), sets the credit the receive
//! pool allows, fires its timers if the earliest is due, then sends the
//! datagrams it queued and reports its events (fragments acknowledged or
//! failed, peers lost).
//!
//! * `send` hands a descriptor to the reliability state, which sequences it
//!   and keeps a handle to it for retransmission: nothing is copied.
//! * A send completion only returns the send credit: the descriptor's
//!   callback runs when the peer acknowledges it (or fails when the peer is
//!   declared lost).
//! * A received datagram's reliability header goes to the state
//!   (`receive.rs`), which says whether to deliver it now, hold its buffer
//!   until an earlier one arrives, or drop it (duplicate, acknowledgement
//!   only).
//! * A small whole message rides in the datagram of an earlier one to the
//!   same peer that has not left yet (`coalesce.rs`): the newest fragment of a
//!   full window's backlog, or the open carrier, the small message of a
//!   burst (sends with no progress call in between) held back until the
//!   next progress call (`close_open_carrier`). It completes right after
//!   its carrier, and the receiver splits the datagram into its messages
//!   (`deliver.rs`).
//! * In a burst to one peer, up to two sends in a row that would leave at
//!   once (closed carriers, trains) wait for the next, so that the fabric
//!   can join their datagrams in one GSO send (`Coalescer::hold`).
//! * Acknowledgements and retransmissions go out (`outgoing.rs`) at the end
//!   of each progress call, after timers that are due; while nothing is owed no timer is
//!   armed (a peer's last deadline fires once, for nothing, after its work
//!   ends), so an idle progress call costs one comparison.

use udbtl_fabric::Context;
use udbtl_reliability::{Event, Instant, LossReason, PeerId, SendError};

mod coalesce;
mod receive;
mod state;
mod train;

pub(super) use coalesce::Coalescer;
use coalesce::may_carry;

pub(super) use state::{Reliable, RingLayout, random_process_id};

use super::transmit::WaitingSend;
use super::{Engine, Flush, SendStatus};
use crate::EndpointId;
use crate::error::{BtlError, SendFailure};
use crate::frag::{Descriptor, FragState, Leaving, UserBytes};

/// Most unknown senders remembered between two `take_unknown_peers` calls.
const UNKNOWN_PEERS_MAX: usize = 1024;

impl<C: Context> Engine<C> {
    /// The fabric's clock, as the reliability state counts time.
    pub(super) fn clock(&self) -> Instant {
        Instant::from_duration(self.ctx.now())
    }

    /// `send` for a reliable module: the descriptor is owned by the BTL until
    /// acknowledged.
    ///
    /// A small whole message may not leave at once when coalescing is on:
    /// it rides in the datagram of an earlier one to the same peer that has
    /// not left either (the open carrier of a burst, or the newest of a full
    /// window's backlog), or, sent in a burst, it becomes the open carrier
    /// itself. The first send after a progress call always leaves at once,
    /// so a ping-pong pays nothing.
    pub(super) fn send_reliable(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
        flush: Flush,
    ) -> Result<SendStatus, BtlError> {
        let now = self.clock();
        // Lent memory is given back only by the acknowledgement: ask for it
        // at once, or the caller waits out the peer's delayed acknowledgement.
        // Not for memory the BTL holds a share of (`send_message_shared`) or
        // its own bounce buffers: nobody waits for them (ob1 completes a
        // message it copied at once), and asking on every datagram of a
        // stream drew an acknowledgement per 1.6 datagrams instead of per
        // 4.4 (udbench at 256 KiB across the veth: 314 692 against 116 080
        // for the same 506 882 datagrams), each a receive and a send for
        // nothing.
        let user = self.frags.get(des).and_then(|f| f.user.as_ref());
        let lent = user.is_some();
        let awaited = user.is_some_and(|u| matches!(u.data, UserBytes::Lent(_)));
        let peer = PeerId(endpoint.0);
        let previous = self.coalescer.note_send(peer.0);
        let burst = previous.is_some();
        let same_peer = previous == Some(peer.0);
        if !same_peer && self.coalescer.holds() {
            // What waits for more to its peer leaves before a send to another.
            self.close_open_carrier(now);
            self.flush_transmits(now);
        }
        let coalescing = self.coalescer.enabled() && !lent;
        if coalescing {
            // Into the open carrier only, if there is one to this peer: the
            // backlog's datagrams are older than it.
            let carrier = match self.coalescer.open_carrier() {
                Some(open) if self.frags.get(open).is_some_and(|f| f.endpoint == peer.0) => {
                    Some(open)
                }
                Some(_) => None,
                None => self
                    .path
                    .reliable()
                    .and_then(|r| r.core.backlog_tail(peer).copied()),
            };
            let sizes = (self.header_len, self.limits.eager_limit);
            if carrier.is_some_and(|c| {
                self.coalescer
                    .ride(&mut self.ctx, &mut self.frags, sizes, c, peer, des)
            }) {
                self.stats.messages_coalesced += 1;
                return Ok(self.send_status());
            }
        }
        // Not carried: what is held back leaves first, keeping each peer's
        // order.
        let closed = self.close_open_carrier(now);
        if self.heads_train(des) {
            // A train that follows one to the same peer in a burst may wait
            // for the next, to share GSO sends with it (`Coalescer::hold`).
            let held =
                flush == Flush::Now && self.coalescer.enabled() && self.coalescer.hold(same_peer);
            let flush = if held { Flush::Later } else { flush };
            return self.send_train(now, peer, des, awaited, flush);
        }
        let to_peer = |err: SendError| match err {
            SendError::NoPeer(_) => BtlError::BadEndpoint {
                endpoint: endpoint.0,
            },
            _ => BtlError::PeerUnavailable {
                endpoint: endpoint.0,
                reason: err.to_string(),
            },
        };
        if coalescing && burst && may_carry(&self.frags, peer, des) {
            // Refused now, as `sequence` would refuse it, not at close.
            if let Some(reliable) = self.path.reliable() {
                reliable.core.accepts(peer).map_err(to_peer)?;
            }
            if let Some(frag) = self.frags.get_mut(des) {
                frag.state = FragState::Posted;
            }
            self.coalescer.open(des);
            // The carrier closed may wait for the next to the same peer, to
            // share a send with it.
            let held = closed && self.coalescer.hold(same_peer);
            if closed && !held && flush == Flush::Now {
                self.flush_transmits(now);
            }
            return Ok(self.send_status());
        }
        self.sequence(now, peer, des, awaited).map_err(to_peer)?;
        // Send at once rather than at the next progress call (latency),
        // unless more of the same message follows.
        if flush == Flush::Now {
            self.flush_transmits(now);
        }
        Ok(self.send_status())
    }

    fn send_status(&self) -> SendStatus {
        if self.tx.sends.len() == 0 {
            SendStatus::Posted
        } else {
            SendStatus::Queued
        }
    }

    /// Hands `des` to the reliability state, which sequences it now or when
    /// the window opens; `awaited`: its sender waits for the acknowledgement.
    fn sequence(
        &mut self,
        now: Instant,
        peer: PeerId,
        des: Descriptor,
        awaited: bool,
    ) -> Result<(), SendError> {
        let Some(reliable) = self.path.reliable_mut() else {
            return Err(SendError::NoPeer(peer.0));
        };
        if awaited {
            reliable.core.send_awaited(now, peer, des)?;
        } else {
            reliable.core.send(now, peer, des)?;
        }
        if let Some(frag) = self.frags.get_mut(des) {
            frag.state = FragState::Posted;
        }
        Ok(())
    }

    /// Timers, transmissions and events, after a progress call's
    /// completions.
    ///
    /// `drained` says whether the poll emptied the fabric: a peer is never
    /// declared lost while acknowledgements from it may still sit unread.
    pub(super) fn drive_reliability(&mut self, now: Instant, drained: bool) {
        let (free, floor) = self.recv.credit_room(self.held_for_app, self.app_present);
        let Some(reliable) = self.path.reliable_mut() else {
            return;
        };
        reliable.core.share_credit(now, free, floor);
        if reliable.core.poll_timeout().is_some_and(|at| at <= now) {
            if drained {
                reliable.core.handle_timeout(now);
            } else {
                reliable.core.handle_timeout_deferring_failures(now);
            }
        }
        self.flush_transmits(now);
        self.process_events();
    }

    /// Notes that the engine runs at `now`. A gap since the last run of more
    /// than half the peer timeout means this process was not running
    /// (stopped, suspended, starved): no evidence against any peer, whose
    /// failure clocks restart.
    pub(super) fn note_running(&mut self, now: Instant) {
        let Some(reliable) = self.path.reliable_mut() else {
            return;
        };
        let jump = reliable.core.config().peer_timeout / 2;
        if let Some(last) = reliable.last_run {
            if now.saturating_since(last) > jump {
                tracing::warn!(
                    gap = ?now.saturating_since(last),
                    "this process did not run for a while; peers' failure clocks restart"
                );
                reliable.core.resume(now);
            }
        }
        reliable.last_run = Some(now);
    }

    /// Runs callbacks for acknowledged and failed descriptors; reposts
    /// buffers the state gave back.
    fn process_events(&mut self) {
        loop {
            let Some(reliable) = self.path.reliable_mut() else {
                return;
            };
            if let Some(held) = reliable.core.poll_reclaim() {
                self.recv.early_held -= 1;
                self.recv.repost(held.slot);
                continue;
            }
            let Some(event) = reliable.core.poll_event() else {
                return;
            };
            match event {
                Event::Acked { frag, .. } => self.finish_datagram(frag, Ok(())),
                Event::Failed { peer, frag } => self.finish_datagram(
                    frag,
                    Err(SendFailure::PeerLost(format!(
                        "endpoint {} stopped acknowledging",
                        peer.0
                    ))),
                ),
                Event::PeerLost { peer, reason } => {
                    reliable.reassembly.discard(EndpointId(peer.0));
                    self.forget_reads_of(EndpointId(peer.0));
                    let message = match reason {
                        LossReason::Reset => format!(
                            "endpoint {} broke the stream: it declared this process lost",
                            peer.0
                        ),
                        _ => format!(
                            "endpoint {} was declared lost: nothing heard from it within peer_timeout",
                            peer.0
                        ),
                    };
                    self.report_error(Some(EndpointId(peer.0)), false, message);
                }
                Event::PeerClosed { peer } => {
                    reliable.reassembly.discard(EndpointId(peer.0));
                    self.forget_reads_of(EndpointId(peer.0));
                }
            }
        }
    }

    /// Puts on the wire what the reliability state wants sent, oldest first:
    /// data takes a send credit or waits for one behind earlier sends;
    /// acknowledgements need none.
    pub(super) fn flush_transmits(&mut self, now: Instant) {
        self.coalescer.flushed();
        self.post_waiting();
        while let Some(reliable) = self.path.reliable_mut() {
            let Some(tx) = reliable.core.poll_transmit(now) else {
                break;
            };
            let mut header = tx.header;
            header.src = self.proc_id;
            header.flags |= reliable.integrity.flags();
            let Some(des) = tx.frag else {
                self.transmit_ack(EndpointId(tx.peer.0), header, tx.epochs);
                continue;
            };
            // A resend of a datagram that has not left this host yet (a
            // timeout under load) is not posted again: see `Leaving`.
            match self.frags.get(des).map(|f| f.leaving) {
                Some(Leaving::WaitingForCredit)
                    if self.tx.sends.restamp(des, (header, tx.epochs)) => {}
                Some(Leaving::InBatch(batch)) if batch == self.tx.batch_number() => {}
                _ if self.tx.sends.can_post() => {
                    self.transmit_data(des, header, tx.epochs, tx.retransmission);
                }
                _ => {
                    self.tx.sends.push(WaitingSend {
                        des,
                        header: Some((header, tx.epochs)),
                        resend: tx.retransmission,
                    });
                    if let Some(frag) = self.frags.get_mut(des) {
                        frag.leaving = Leaving::WaitingForCredit;
                    }
                }
            }
        }
        self.post_batch();
    }

    /// The engine's side of `Module::take_unknown_peers`, whose documentation is the
    /// contract.
    pub(super) fn take_unknown_peers(&mut self) -> Vec<u32> {
        self.path
            .reliable_mut()
            .map(|r| std::mem::take(&mut r.unknown_peers))
            .unwrap_or_default()
    }

    /// The engine's side of `Module::unacknowledged`, whose documentation is the
    /// contract.
    pub(super) fn unacknowledged(&self) -> usize {
        let Some(reliable) = self.path.reliable() else {
            return 0;
        };
        let carriers: usize = self
            .endpoints
            .ids()
            .filter_map(|id| reliable.core.queued(PeerId(id.0)))
            .map(|(in_flight, backlog)| in_flight + backlog)
            .sum();
        carriers + self.coalescer.holding()
    }
}
