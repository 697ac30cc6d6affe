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
//! * A received datagram's reliability header goes to the state, which says
//!   whether to deliver it now, hold its buffer until an earlier one
//!   arrives, or drop it (duplicate, acknowledgement only).
//! * A small whole message rides in the datagram of an earlier one to the
//!   same peer that has not left yet (`ride`): the newest fragment of a
//!   full window's backlog, or the open carrier, the small message of a
//!   burst (sends with no progress call in between) held back until the
//!   next progress call (`close_open_carrier`). It completes right after
//!   its carrier, and the receiver splits the datagram into its messages
//!   (`recv.rs`, `host.rs`).
//! * Acknowledgements and retransmissions go out at the end of each progress
//!   call, after timers that are due; while nothing is owed no timer is
//!   armed (a peer's last deadline fires once, for nothing, after its work
//!   ends), so an idle progress call costs one comparison.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use udbtl_fabric::{Context, Mr, MrHandle, QpAddr, Sge};
use udbtl_reliability::{
    Config, ConfigError, Event, Instant, LossReason, PeerId, Receipt, Reliability, Room, SendError,
};
use udbtl_wire::datagram::AuthKey;
use udbtl_wire::{btl, coalesced, datagram, modex, rel};

use super::build::HEADER_MAX;
use super::events::Callbacks;
use super::messages::{Piece, Reassembly};
use super::recv::{Delivery, Held};
use super::send::{QueuedPost, WaitingSend};
use super::{Engine, RecvEvent, SendStatus};
use crate::error::{BtlError, SendFailure};
use crate::frag::{DesFlags, Descriptor, FragKind, FragState};
use crate::params::Params;
use crate::{EndpointId, Tag};

/// Most unknown senders remembered between two `take_unknown_peers` calls.
const UNKNOWN_PEERS_MAX: usize = 1024;
/// Registered buffers for acknowledgement-only datagrams, used in turn.
const ACK_SLOTS: usize = 64;
/// Bytes of one acknowledgement buffer.
const ACK_LEN: usize = HEADER_MAX;

/// How a reliable module protects its datagrams.
#[derive(Debug, Clone, Copy)]
pub(super) enum Integrity {
    /// The fabric checks integrity end to end (InfiniBand's ICRC).
    Fabric,
    /// A CRC-32 of every datagram.
    Checksum,
    /// A MAC of every datagram under its receiver's key; `own` is the key
    /// this module's peers use. With the job's datagram secret `job`, every
    /// module's key derives from it and its address, so none is published;
    /// without, `own` is random and published.
    Mac { own: AuthKey, job: Option<AuthKey> },
}

/// What checking a received datagram found.
enum Check {
    Intact,
    BadChecksum,
    Unauthenticated,
}

/// Fills in the checksum or MAC that `header`'s flags ask for, over the
/// datagram `head` followed by `rest`. `false` if it asks for a MAC and the
/// peer has no key, which `add_procs` never lets happen.
fn seal(head: &mut [u8], rest: &[&[u8]], header: &rel::Repr, peer_key: Option<AuthKey>) -> bool {
    if header.has(rel::FLAG_CHECKSUM) {
        datagram::fill_checksum(head, rest);
    } else if header.has(rel::FLAG_MAC) {
        let Some(key) = peer_key else {
            return false;
        };
        datagram::fill_mac(head, rest, &key);
    }
    true
}

/// The reliable part of a module.
#[derive(Debug)]
pub(super) struct Reliable {
    pub(super) core: Reliability<Descriptor, Held>,
    /// How datagrams are protected.
    integrity: Integrity,
    /// Registered buffers for acknowledgement-only datagrams, used in turn:
    /// such a datagram is unsignaled, so it needs no fragment and no credit.
    ack_ring: Mr,
    ack_next: usize,
    /// Senders not known yet, by process id (see `take_unknown_peers`).
    unknown_peers: Vec<u32>,
    reassembly: Reassembly,
    /// When the engine last ran (progress or helper), to notice that the
    /// process was stopped.
    last_run: Option<Instant>,
}

impl Reliable {
    /// Bytes of the acknowledgement ring's registration.
    pub(super) const ACK_RING_BYTES: usize = ACK_SLOTS * ACK_LEN;

    /// The reliable part of a module whose datagrams carry up to `datagram`
    /// payload bytes.
    pub(super) fn new(
        params: &Params,
        datagram: usize,
        ack_ring: Mr,
        integrity: Integrity,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            core: reliability_state(params, datagram)?,
            integrity,
            ack_ring,
            ack_next: 0,
            unknown_peers: Vec::new(),
            reassembly: Reassembly::default(),
            last_run: None,
        })
    }

    /// The key peers authenticate their datagrams to this module with.
    pub(super) const fn own_key(&self) -> Option<AuthKey> {
        match self.integrity {
            Integrity::Mac { own, .. } => Some(own),
            _ => None,
        }
    }

    /// How datagrams are protected, for the dump.
    pub(super) const fn integrity_name(&self) -> &'static str {
        match self.integrity {
            Integrity::Fabric => "fabric",
            Integrity::Checksum => "crc32",
            Integrity::Mac { job: Some(_), .. } => "mac (keys from the job secret)",
            Integrity::Mac { job: None, .. } => "mac (published keys)",
        }
    }

    /// How this module's address says it authenticates.
    pub(super) const fn auth(&self) -> modex::Auth {
        match self.integrity {
            Integrity::Mac { job: Some(_), .. } => modex::Auth::Derived,
            Integrity::Mac { own, job: None } => modex::Auth::Key(own),
            Integrity::Fabric | Integrity::Checksum => modex::Auth::Off,
        }
    }

    /// The key to MAC datagrams to `peer` with (`Some(None)`: none, as
    /// neither side authenticates), or `None` if the two sides cannot talk:
    /// one authenticates and the other not, or one derives its keys from a
    /// job secret and the other publishes them.
    pub(super) fn peer_key(&self, peer: &modex::Address) -> Option<Option<AuthKey>> {
        match (self.integrity, peer.auth) {
            (Integrity::Fabric | Integrity::Checksum, modex::Auth::Off) => Some(None),
            (Integrity::Mac { job: None, .. }, modex::Auth::Key(key)) => Some(Some(key)),
            (Integrity::Mac { job: Some(job), .. }, modex::Auth::Derived) => {
                Some(Some(modex::derive_receive_key(&job, peer)))
            }
            _ => None,
        }
    }

    /// Peers with a multi-datagram message in progress.
    pub(super) fn messages_in_progress(&self) -> usize {
        self.reassembly.in_progress()
    }

    pub(super) const fn ack_ring_handle(&self) -> MrHandle {
        self.ack_ring.handle
    }

    /// The next acknowledgement buffer.
    fn next_ack_slot(&mut self) -> Sge {
        let offset = (self.ack_next % ACK_SLOTS) * ACK_LEN;
        self.ack_next = self.ack_next.wrapping_add(1);
        Sge {
            lkey: self.ack_ring.lkey,
            offset,
            len: ACK_LEN,
        }
    }
}

/// The reliability state the parameters ask for.
fn reliability_state(
    params: &Params,
    datagram: usize,
) -> Result<Reliability<Descriptor, Held>, ConfigError> {
    let window = match params.rel_window {
        0 => default_window(datagram),
        asked => u16::try_from(asked).unwrap_or(udbtl_reliability::MAX_WINDOW),
    };
    // A lost peer is reported within one RTO of the timeout; keep the RTO
    // well under it, as UCX does (a third).
    let rto_max = Duration::from_millis(u64::from(params.peer_timeout) / 3)
        .clamp(Duration::from_millis(3), Duration::from_secs(2));
    let config = Config {
        window,
        initial_cwnd: window.min(16),
        peer_timeout: Duration::from_millis(u64::from(params.peer_timeout)),
        rto_max,
        rto_min: Duration::from_micros(u64::from(params.rto_min)).min(rto_max),
        rto_initial: Config::default().rto_initial.min(rto_max),
        keepalive: params.keepalive,
        ..Config::default()
    };
    Reliability::new(config)
}

/// The window `rel_window = 0` picks: about 1 MiB of datagrams in flight,
/// so that a stream of MTU-sized datagrams is not held to 64 per round trip
/// while 64 KiB datagrams keep to the socket buffers' size.
fn default_window(datagram: usize) -> u16 {
    const IN_FLIGHT: usize = 1 << 20;
    let datagrams = IN_FLIGHT / datagram.max(1);
    datagrams.clamp(64, usize::from(udbtl_reliability::MAX_WINDOW)) as u16
}

/// A random id for this process, for modules whose caller does not name the
/// process (see `Module::set_process_id`): unique only with high
/// probability.
pub(super) fn random_process_id() -> u32 {
    // RandomState is seeded from the OS's randomness once per process.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish() as u32
}

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
    ) -> Result<SendStatus, BtlError> {
        if self.reliable.is_none() {
            return Err(super::descriptors::bad(
                des,
                "sent reliably by an unreliable module",
            ));
        }
        let now = self.clock();
        // Lent memory is given back only by the acknowledgement: ask for it
        // at once, or the caller waits out the peer's delayed acknowledgement.
        let lent = self.frags.get(des).is_some_and(|f| f.user.is_some());
        let peer = PeerId(endpoint.0);
        let burst = std::mem::replace(&mut self.sent_since_progress, true);
        if self.coalesce && !lent {
            // Into the open carrier only, if there is one to this peer: the
            // backlog's datagrams are older than it.
            let carrier = match self.open_carrier {
                Some(open) if self.frags.get(open).is_some_and(|f| f.endpoint == peer.0) => {
                    Some(open)
                }
                Some(_) => None,
                None => self
                    .reliable
                    .as_ref()
                    .and_then(|r| r.core.backlog_tail(peer).copied()),
            };
            if carrier.is_some_and(|c| self.ride(c, peer, des)) {
                self.stats.messages_coalesced += 1;
                return Ok(self.send_status());
            }
        }
        // Not carried: what is held back leaves first, keeping each peer's
        // order.
        let closed = self.close_open_carrier(now);
        let to_peer = |err: SendError| match err {
            SendError::NoPeer(_) => BtlError::BadEndpoint {
                endpoint: endpoint.0,
            },
            _ => BtlError::PeerUnavailable {
                endpoint: endpoint.0,
                reason: err.to_string(),
            },
        };
        if self.coalesce && !lent && burst && self.may_carry(peer, des) {
            // Refused now, as `sequence` would refuse it, not at close.
            if let Some(reliable) = self.reliable.as_ref() {
                reliable.core.accepts(peer).map_err(to_peer)?;
            }
            if let Some(frag) = self.frags.get_mut(des) {
                frag.state = FragState::Posted;
            }
            self.open_carrier = Some(des);
            if closed && !self.defer_transmits {
                self.flush_transmits(now);
            }
            return Ok(self.send_status());
        }
        self.sequence(now, peer, des, lent).map_err(to_peer)?;
        // Send at once rather than at the next progress call (latency),
        // unless more of the same message follows.
        if !self.defer_transmits {
            self.flush_transmits(now);
        }
        Ok(self.send_status())
    }

    fn send_status(&self) -> SendStatus {
        if self.sends.len() == 0 {
            SendStatus::Posted
        } else {
            SendStatus::Queued
        }
    }

    /// Hands `des` to the reliability state, which sequences it now or when
    /// the window opens.
    fn sequence(
        &mut self,
        now: Instant,
        peer: PeerId,
        des: Descriptor,
        lent: bool,
    ) -> Result<(), SendError> {
        let Some(reliable) = self.reliable.as_mut() else {
            return Err(SendError::NoPeer(peer.0));
        };
        if lent {
            reliable.core.send_awaited(now, peer, des)?;
        } else {
            reliable.core.send(now, peer, des)?;
        }
        if let Some(frag) = self.frags.get_mut(des) {
            frag.state = FragState::Posted;
        }
        Ok(())
    }

    /// Hands the open carrier, with its riders, to the reliability state;
    /// says whether there was one. Not flushed: the caller flushes. A peer
    /// that can no longer be sent to fails the carrier and its riders.
    pub(super) fn close_open_carrier(&mut self, now: Instant) -> bool {
        let Some(des) = self.open_carrier.take() else {
            return false;
        };
        let peer = PeerId(self.frags.get(des).map_or(u32::MAX, |f| f.endpoint));
        if let Err(err) = self.sequence(now, peer, des, false) {
            self.complete_with_riders(des, Err(SendFailure::Refused(err.to_string())));
        }
        true
    }

    /// Whether `des` may carry later messages to `peer` in its datagram:
    /// the conditions [`ride`](Self::ride) puts on a carrier.
    fn may_carry(&self, peer: PeerId, des: Descriptor) -> bool {
        des.kind() == FragKind::Send
            && self.frags.get(des).is_some_and(|f| {
                f.flags.contains(DesFlags::BTL_OWNERSHIP) && f.endpoint == peer.0 && may_ride(f)
            })
    }

    /// Packs the whole message in `des` into the datagram of `carrier`, a
    /// fragment to `peer` that has never been sequenced nor transmitted (the
    /// open carrier, or the newest of the peer's backlog), if both fit.
    /// On success `des` becomes the carrier's last rider: Posted, owned by
    /// the BTL until the carrier's acknowledgement (or failure) completes it
    /// right after the carrier. On refusal nothing changed.
    ///
    /// Eligible are send fragments with their bytes in BTL registered memory
    /// (no lent or user bytes), holding a whole message no longer than a
    /// record may be; the carrier must also be BTL-owned (it is freed after
    /// its callback, so its rewritten segment is never seen again).
    fn ride(&mut self, carrier: Descriptor, peer: PeerId, des: Descriptor) -> bool {
        let (Some(c), Some(r)) = (self.frags.get(carrier), self.frags.get(des)) else {
            return false;
        };
        if carrier == des
            || des.kind() != FragKind::Send
            || c.state != FragState::Posted
            || !may_ride(r)
            || !self.may_carry(peer, carrier)
        {
            return false;
        }
        let packed = c.msg_flags & rel::FLAG_COALESCED != 0;
        let list_len = if packed {
            c.seg_len
        } else {
            coalesced::record_len(c.seg_len)
        };
        if list_len + coalesced::record_len(r.seg_len) > self.limits.eager_limit {
            return false;
        }
        let (c_len, c_tag, c_tail, r_len, r_tag) =
            (c.seg_len, c.tag, c.rider_tail, r.seg_len, r.tag);
        // The rider's bytes go through the scratch buffer: the two fragments
        // may share a registration, which cannot be borrowed twice.
        let header_len = self.header_len;
        let Some((r_mr, r_sge)) = self.frags.head(des, header_len + r_len) else {
            return false;
        };
        let Some(bytes) = self
            .ctx
            .mr_bytes(r_mr.handle)
            .ok()
            .and_then(|b| b.get(r_sge.offset + header_len..r_sge.offset + r_sge.len))
        else {
            return false;
        };
        self.coalesce_scratch.clear();
        self.coalesce_scratch.extend_from_slice(bytes);
        let Some((c_mr, c_sge)) = self
            .frags
            .head(carrier, header_len + self.limits.eager_limit)
        else {
            return false;
        };
        let Some(list) = self
            .ctx
            .mr_bytes_mut(c_mr.handle)
            .ok()
            .and_then(|b| b.get_mut(c_sge.offset + header_len..c_sge.offset + c_sge.len))
        else {
            return false;
        };
        let start = if packed {
            Ok(c_len)
        } else {
            coalesced::wrap_in_place(list, c_tag, c_len)
        };
        let Ok(end) =
            start.and_then(|at| coalesced::append(list, at, r_tag, &self.coalesce_scratch))
        else {
            // Only on a fragment stride shorter than the eager limit, which
            // the build never makes; the carrier is then as it was.
            return false;
        };
        if let Some(c) = self.frags.get_mut(carrier) {
            c.seg_len = end;
            c.msg_flags |= rel::FLAG_COALESCED;
            c.rider_tail = Some(des);
            if c_tail.is_none() {
                c.rider = Some(des);
            }
        }
        if let Some(tail) = c_tail.and_then(|t| self.frags.get_mut(t)) {
            tail.rider = Some(des);
        }
        if let Some(r) = self.frags.get_mut(des) {
            r.rider = None;
            r.rider_tail = None;
            r.state = FragState::Posted;
        }
        self.riders_waiting += 1;
        true
    }

    /// Completes a descriptor and then, in order, the messages that rode in
    /// its datagram, with the same status.
    fn complete_with_riders(&mut self, des: Descriptor, status: Result<(), SendFailure>) {
        let mut next = self.frags.get_mut(des).and_then(|f| {
            f.rider_tail = None;
            f.rider.take()
        });
        self.complete_send(des, status.clone());
        while let Some(rider) = next {
            next = self.frags.get_mut(rider).and_then(|f| f.rider.take());
            self.riders_waiting = self.riders_waiting.saturating_sub(1);
            self.complete_send(rider, status.clone());
        }
    }

    /// Timers, transmissions and events, after a progress call's
    /// completions.
    ///
    /// `drained` says whether the poll emptied the fabric: a peer is never
    /// declared lost while acknowledgements from it may still sit unread.
    pub(super) fn drive_reliability(&mut self, now: Instant, drained: bool) {
        let credit =
            self.recv
                .credit_for(self.held_for_app, self.app_present, self.endpoints.len());
        let Some(reliable) = self.reliable.as_mut() else {
            return;
        };
        reliable.core.set_credit(credit);
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
        let Some(reliable) = self.reliable.as_mut() else {
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
            let Some(reliable) = self.reliable.as_mut() else {
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
                Event::Acked { frag, .. } => self.complete_with_riders(frag, Ok(())),
                Event::Failed { peer, frag } => self.complete_with_riders(
                    frag,
                    Err(SendFailure::PeerLost(format!(
                        "endpoint {} stopped acknowledging",
                        peer.0
                    ))),
                ),
                Event::PeerLost { peer, reason } => {
                    reliable.reassembly.discard(EndpointId(peer.0));
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
                Event::PeerClosed { peer } => reliable.reassembly.discard(EndpointId(peer.0)),
            }
        }
    }

    /// Puts on the wire what the reliability state wants sent, oldest first:
    /// data takes a send credit or waits for one behind earlier sends;
    /// acknowledgements need none.
    pub(super) fn flush_transmits(&mut self, now: Instant) {
        self.post_waiting();
        while let Some(reliable) = self.reliable.as_mut() {
            let Some(tx) = reliable.core.poll_transmit(now) else {
                break;
            };
            let mut header = tx.header;
            header.src = self.proc_id;
            header.flags |= match reliable.integrity {
                Integrity::Fabric => 0,
                Integrity::Checksum => rel::FLAG_CHECKSUM,
                Integrity::Mac { .. } => rel::FLAG_MAC,
            };
            match tx.frag {
                Some(des) if self.sends.can_post() => self.transmit_data(des, header),
                Some(des) => self.sends.push(WaitingSend {
                    des,
                    header: Some(header),
                }),
                None => self.transmit_ack(EndpointId(tx.peer.0), header),
            }
        }
        self.post_batch();
    }

    /// Queues a datagram for the batch `flush_transmits` posts, posting the
    /// batch first when it is full.
    fn queue_post(&mut self, post: QueuedPost) {
        if post.signaled {
            self.sends.take_credit();
        }
        if self.batch.push(post) {
            self.post_batch();
        }
    }

    /// Posts the queued datagrams. A refused one is a loss to the protocol,
    /// which retransmission repairs; its credit comes back at once.
    fn post_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let outcome = poster!(self).post_batch(&mut self.ctx, &self.frags, &mut self.batch);
        for _ in 0..outcome.refused_signaled {
            self.sends.return_credit();
        }
        self.stats.sends_posted += outcome.posted_signaled as u64;
        self.stats.transmit_failures += outcome.refused as u64;
    }

    /// Writes the reliability header into a descriptor and posts it. A
    /// refusal is a loss to the protocol: the retransmission timer repairs
    /// it.
    pub(super) fn transmit_data(&mut self, des: Descriptor, mut header: rel::Repr) {
        let Some(frag) = self.frags.get(des) else {
            return;
        };
        header.flags |= frag.msg_flags;
        let endpoint = EndpointId(frag.endpoint);
        let (Some(route), Some(peer)) =
            (self.endpoints.route(endpoint), self.endpoints.get(endpoint))
        else {
            self.stats.transmit_failures += 1;
            return;
        };
        let peer_key = peer.auth_key;
        let Some((mr, sge)) = self.frags.head(des, self.header_len + frag.seg_len) else {
            return;
        };
        let Ok(bytes) = self.ctx.mr_bytes_mut(mr.handle) else {
            return;
        };
        let head = &mut bytes[sge.offset..sge.offset + sge.len];
        let Ok(mut ext) = datagram::extension_mut(head) else {
            return;
        };
        header.emit(&mut ext);
        let user = frag
            .user
            .as_ref()
            .map_or(&[][..], |u| &u.data.bytes()[u.range.clone()]);
        if !seal(head, &[user], &header, peer_key) {
            self.stats.transmit_failures += 1;
            return;
        }
        let user = frag.user.is_some().then_some(des);
        self.queue_post(QueuedPost {
            route,
            head: sge,
            user,
            wr_id: u64::from(des.raw()),
            signaled: true,
        });
    }

    /// Sends an acknowledgement-only datagram from the ack ring, unsignaled:
    /// it needs no completion and no send credit.
    fn transmit_ack(&mut self, endpoint: EndpointId, header: rel::Repr) {
        let (Some(route), Some(peer)) =
            (self.endpoints.route(endpoint), self.endpoints.get(endpoint))
        else {
            return;
        };
        let peer_key = peer.auth_key;
        let Some(reliable) = self.reliable.as_mut() else {
            return;
        };
        let slot = reliable.next_ack_slot();
        let Ok(bytes) = self.ctx.mr_bytes_mut(reliable.ack_ring.handle) else {
            return;
        };
        let buf = &mut bytes[slot.offset..slot.offset + slot.len];
        btl::Repr {
            tag: 0,
            job_key: self.job_key,
            reliable: true,
        }
        .emit(&mut btl::Packet::new_unchecked(&mut *buf));
        let Ok(mut ext) = datagram::extension_mut(buf) else {
            return;
        };
        header.emit(&mut ext);
        if !seal(buf, &[], &header, peer_key) {
            self.stats.transmit_failures += 1;
            return;
        }
        self.queue_post(QueuedPost {
            route,
            head: slot,
            user: None,
            wr_id: u64::MAX,
            signaled: false,
        });
    }

    /// A received reliable datagram from `src`, carrying `job_key` (one the
    /// module accepts).
    pub(super) fn on_reliable_receive(
        &mut self,
        held: Held,
        src: QpAddr,
        job_key: u32,
        now: Instant,
    ) {
        let own_key = self.reliable.as_ref().and_then(Reliable::own_key);
        let parsed = self.recv.datagram(&self.ctx, held).and_then(|bytes| {
            let tag = btl::Packet::new_checked(bytes).ok()?.tag();
            let header = rel::Repr::parse(&datagram::extension(bytes).ok()?).ok()?;
            // A module that authenticates checks its key before anything
            // else about the sender; one that does not cannot check a MAC.
            let check = match own_key {
                Some(key) if header.has(rel::FLAG_MAC) && datagram::verify_mac(bytes, &key) => {
                    Check::Intact
                }
                Some(_) => Check::Unauthenticated,
                None if header.has(rel::FLAG_MAC) => Check::Unauthenticated,
                None if header.has(rel::FLAG_CHECKSUM) && !datagram::verify_checksum(bytes) => {
                    Check::BadChecksum
                }
                None => Check::Intact,
            };
            Some((tag, header, check))
        });
        let Some((tag, header, check)) = parsed else {
            self.stats.recv_malformed += 1;
            self.recv.repost(held.slot);
            return;
        };
        match check {
            Check::Intact => {}
            Check::BadChecksum => {
                self.stats.recv_bad_checksum += 1;
                self.recv.repost(held.slot);
                return;
            }
            Check::Unauthenticated => {
                self.stats.recv_unauthenticated += 1;
                self.recv.repost(held.slot);
                return;
            }
        }
        let endpoint = self.endpoints.lookup(src);
        let known = endpoint
            .and_then(|ep| self.endpoints.get(ep))
            .map(|e| (e.proc_id, e.job_key));
        let (Some(endpoint), Some(reliable)) = (
            endpoint.filter(|_| known == Some((header.src, job_key))),
            self.reliable.as_mut(),
        ) else {
            self.stats.recv_unknown_peer += 1;
            // A process of this job that knows us before we know it
            // (addresses fetched lazily): the caller can look it up by the
            // id it carries; the sender retransmits once it is connected.
            // Processes of other jobs are only ever added by the caller.
            if let Some(reliable) = self.reliable.as_mut() {
                if endpoint.is_none()
                    && job_key == self.job_key
                    && reliable.unknown_peers.len() < UNKNOWN_PEERS_MAX
                    && !reliable.unknown_peers.contains(&header.src)
                {
                    reliable.unknown_peers.push(header.src);
                }
            }
            self.recv.repost(held.slot);
            return;
        };
        let can_hold = self.recv.may_hold(self.held_for_app, self.app_present);
        let room = Room {
            // While the application runs, an in-order datagram is delivered
            // before this progress call returns; while it is away, its
            // buffer is kept until it comes back.
            in_order: self.app_present || can_hold,
            early: can_hold,
        };
        match reliable
            .core
            .on_datagram(now, PeerId(endpoint.0), &header, held, room)
        {
            Receipt::Deliver(held) => {
                self.deliver_in_order(held, endpoint, Tag(tag), header.flags);
                while let Some((peer, held)) =
                    self.reliable.as_mut().and_then(|r| r.core.poll_deliver())
                {
                    self.recv.early_held -= 1;
                    self.deliver_held(held, EndpointId(peer.0));
                }
            }
            Receipt::Buffered => self.recv.early_held += 1,
            Receipt::Discard(held, _) => self.recv.repost(held.slot),
        }
    }

    /// Delivers a datagram that waited for an earlier one: its headers are
    /// read again from its buffer.
    fn deliver_held(&mut self, held: Held, endpoint: EndpointId) {
        let headers = self.recv.datagram(&self.ctx, held).and_then(|bytes| {
            let tag = btl::Packet::new_checked(bytes).ok()?.tag();
            Some((tag, datagram::extension(bytes).ok()?.flags()))
        });
        match headers {
            Some((tag, flags)) => self.deliver_in_order(held, endpoint, Tag(tag), flags),
            None => {
                self.stats.recv_malformed += 1;
                self.recv.repost(held.slot);
            }
        }
    }

    /// Hands one in-order datagram to the application's next progress.
    fn deliver_in_order(&mut self, held: Held, endpoint: EndpointId, tag: Tag, flags: u16) {
        let Some(src) = self.endpoints.get(endpoint).map(|e| e.remote) else {
            // Held for a peer whose endpoint the caller deleted since.
            self.stats.recv_unknown_peer += 1;
            self.recv.repost(held.slot);
            return;
        };
        self.hold_for_app(Delivery {
            held,
            header_len: HEADER_MAX,
            tag,
            endpoint: Some(endpoint),
            src,
            flags,
        });
    }

    /// Adds one piece of a multi-datagram message; runs the tag callback
    /// when it completes one. Does not repost the buffer.
    pub(super) fn reassemble(
        &mut self,
        callbacks: &mut Callbacks,
        held: Held,
        endpoint: EndpointId,
        src: QpAddr,
        tag: Tag,
        flags: u16,
    ) {
        let Some((tag, message)) = self.add_piece(held, endpoint, tag, flags) else {
            return;
        };
        let endpoint_context = self.endpoints.context(Some(endpoint));
        match callbacks.recv[usize::from(tag.0)].as_mut() {
            Some(callback) => {
                callback(&RecvEvent {
                    tag,
                    endpoint: Some(endpoint),
                    endpoint_context,
                    src,
                    payload: &message,
                });
                self.stats.recvs_delivered += 1;
            }
            None => self.stats.recv_no_callback += 1,
        }
        self.recycle_message(endpoint, message);
    }

    /// Adds one piece of a multi-datagram message; returns the message it
    /// completes, with its tag.
    /// Aborted messages and orphan pieces are counted. Does not repost the
    /// buffer.
    pub(super) fn add_piece(
        &mut self,
        held: Held,
        endpoint: EndpointId,
        tag: Tag,
        flags: u16,
    ) -> Option<(Tag, Vec<u8>)> {
        let piece = match (
            self.recv
                .datagram(&self.ctx, held)
                .and_then(|d| d.get(HEADER_MAX..)),
            self.reliable.as_mut(),
        ) {
            (Some(payload), Some(reliable)) => reliable.reassembly.push(
                endpoint,
                tag.0,
                flags & rel::FLAG_FIRST != 0,
                flags & rel::FLAG_LAST != 0,
                flags & rel::FLAG_ABORT != 0,
                payload,
            ),
            _ => Piece::Orphan,
        };
        match piece {
            Piece::Added => None,
            Piece::Complete(tag, message) => {
                self.stats.messages_reassembled += 1;
                Some((Tag(tag), message))
            }
            Piece::Aborted => {
                self.stats.messages_aborted += 1;
                None
            }
            Piece::Orphan => {
                self.stats.recv_orphan_pieces += 1;
                None
            }
        }
    }

    /// Hands a reassembled message's bytes back, to keep the allocation.
    pub(super) fn recycle_message(&mut self, endpoint: EndpointId, message: Vec<u8>) {
        if let Some(reliable) = self.reliable.as_mut() {
            reliable.reassembly.recycle(endpoint, message);
        }
    }

    /// The engine's side of `Module::take_unknown_peers`, whose documentation is the
    /// contract.
    pub(super) fn take_unknown_peers(&mut self) -> Vec<u32> {
        self.reliable
            .as_mut()
            .map(|r| std::mem::take(&mut r.unknown_peers))
            .unwrap_or_default()
    }

    /// The engine's side of `Module::unacknowledged`, whose documentation is the
    /// contract.
    pub(super) fn unacknowledged(&self) -> usize {
        let Some(reliable) = self.reliable.as_ref() else {
            return 0;
        };
        let carriers: usize = self
            .endpoints
            .ids()
            .filter_map(|id| reliable.core.queued(PeerId(id.0)))
            .map(|(in_flight, backlog)| in_flight + backlog)
            .sum();
        carriers + usize::from(self.open_carrier.is_some()) + self.riders_waiting
    }
}

/// Whether a fragment's message may travel as a record of a coalesced
/// datagram: whole, not aborted, in BTL memory, short enough for a record.
fn may_ride(f: &crate::frag::Frag) -> bool {
    let whole = rel::FLAG_FIRST | rel::FLAG_LAST;
    f.user.is_none()
        && f.msg_flags & (whole | rel::FLAG_ABORT) == whole
        && f.seg_len <= coalesced::MAX_RECORD_LEN
}

/// A wait on the fabric's clock that also ends when that clock stands still
/// while nothing happens: on a simulated fabric only its driver moves time,
/// and a caller waiting inside the BTL would otherwise spin for ever.
pub(super) struct Wait {
    end: Duration,
    last: Duration,
    idle: u32,
}

impl Wait {
    /// Idle progress calls with a clock that did not move before giving up.
    const STILL_CLOCK_POLLS: u32 = 100_000;

    pub(super) fn new(now: Duration, limit: Duration) -> Self {
        Self {
            end: now.saturating_add(limit),
            last: now,
            idle: 0,
        }
    }

    /// Whether the wait is over, after a progress call that handled
    /// `handled` completions at `now`.
    pub(super) fn over(&mut self, now: Duration, handled: usize) -> bool {
        if handled > 0 || now != self.last {
            self.idle = 0;
            self.last = now;
        } else {
            self.idle += 1;
        }
        now >= self.end || self.idle >= Self::STILL_CLOCK_POLLS
    }
}
