//! The module's reliable path: it drives the sans-IO reliability state with
//! what the fabric delivers (see `architecture.md`, "The drive loop").
//!
//! * `send` hands a descriptor to the reliability state, which sequences it
//!   and keeps a handle to it for retransmission: nothing is copied.
//! * A send completion only returns the send credit: the descriptor's
//!   callback runs when the peer acknowledges it (or fails when the peer is
//!   declared lost).
//! * A received datagram's reliability header goes to the state, which says
//!   whether to deliver it now, hold its buffer until an earlier one
//!   arrives, or drop it (duplicate, acknowledgement only).
//! * Acknowledgements and retransmissions go out at the end of each progress
//!   call, after timers that are due; while nothing is owed no timer is
//!   armed, so an idle progress call costs one comparison.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use udbtl_fabric::{Context, Gather, QpAddr, SendFlags, SendWr, Sge};
use udbtl_reliability::{Config, Event, Instant, PeerId, Receipt, Reliability, SendError};
use udbtl_wire::{btl, rel};

use super::{ACK_LEN, ACK_SLOTS, HEADER_MAX, Module, SendStatus};
use crate::error::{BtlError, SendFailure};
use crate::frag::{Descriptor, FragState};
use crate::params::Params;
use crate::{EndpointId, NUM_QP};

/// Most unknown senders remembered between two `take_unknown_peers` calls.
const UNKNOWN_PEERS_MAX: usize = 1024;

/// The reliability state the parameters ask for, if any.
pub(super) fn endpoint_state(params: &Params) -> Option<Reliability<Descriptor, u32>> {
    if !params.reliable {
        return None;
    }
    let window = u16::try_from(params.rel_window).unwrap_or(udbtl_reliability::MAX_WINDOW);
    let config = Config {
        window,
        initial_cwnd: window.min(16),
        peer_timeout: Duration::from_millis(u64::from(params.peer_timeout)),
        // A lost peer is reported within one RTO of the timeout; keep the RTO
        // well under it, as UCX does (a third).
        rto_max: Duration::from_millis(u64::from(params.peer_timeout) / 3)
            .clamp(Duration::from_millis(3), Duration::from_secs(2)),
        ..Config::default()
    };
    match Reliability::new(config) {
        Ok(state) => Some(state),
        Err(err) => {
            // The parameter bounds make this unreachable; fall back to the
            // defaults rather than run unreliably.
            tracing::error!(%err, "reliability settings rejected; using defaults");
            Reliability::new(Config::default()).ok()
        }
    }
}

/// A random id for this process: published in the modex and carried in every
/// reliable datagram, so a receiver can tell a restarted process that
/// reused an address from the one it knew.
pub(super) fn process_id() -> u32 {
    // RandomState is seeded from the OS's randomness once per process.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    (hasher.finish() as u32).max(1)
}

/// The reliability clock: nanoseconds since the module was built.
pub(super) fn now(epoch: std::time::Instant) -> Instant {
    Instant::from_nanos(u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

impl<C: Context> Module<C> {
    /// `send` for a reliable module: the descriptor is owned by the BTL until
    /// acknowledged.
    pub(super) fn send_reliable(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
    ) -> Result<SendStatus, BtlError> {
        let now = now(self.epoch);
        let Some(rel) = self.rel.as_mut() else {
            return Err(Self::bad(des, "sent reliably by an unreliable module"));
        };
        rel.send(now, PeerId(endpoint.0), des)
            .map_err(|err| match err {
                SendError::NoPeer(_) => BtlError::BadEndpoint {
                    endpoint: endpoint.0,
                },
                _ => BtlError::PeerUnavailable {
                    endpoint: endpoint.0,
                    reason: err.to_string(),
                },
            })?;
        if let Some(frag) = self.pool_mut(des).frag_mut(des) {
            frag.state = FragState::Posted;
        }
        // Send at once rather than at the next progress call: latency.
        self.flush_transmits(now);
        self.clock = now;
        Ok(if self.tx_backlog.is_empty() {
            SendStatus::Posted
        } else {
            SendStatus::Queued
        })
    }

    /// Timers, events and transmissions, after a progress call's completions.
    pub(super) fn drive_reliability(&mut self) {
        let now = self.clock;
        let Some(rel) = self.rel.as_mut() else { return };
        if rel.poll_timeout().is_some_and(|at| at <= now) {
            rel.handle_timeout(now);
        }
        self.flush_transmits(now);
        self.process_events();
    }

    /// Runs callbacks for acknowledged and failed descriptors; returns
    /// buffers the state gave back.
    fn process_events(&mut self) {
        loop {
            let Some(rel) = self.rel.as_mut() else { return };
            if let Some(slot) = rel.poll_reclaim() {
                self.repost(slot);
                continue;
            }
            let Some(event) = rel.poll_event() else {
                return;
            };
            match event {
                Event::Acked { frag, .. } => self.complete_send(frag, Ok(())),
                Event::Failed { peer, frag } => self.complete_send(
                    frag,
                    Err(SendFailure::PeerLost(format!(
                        "endpoint {} stopped acknowledging",
                        peer.0
                    ))),
                ),
                Event::PeerLost { peer } => {
                    let message = format!(
                        "endpoint {} was declared lost: no acknowledgement within peer_timeout",
                        peer.0
                    );
                    self.report_error(false, message);
                }
                Event::PeerClosed { .. } => {}
            }
        }
    }

    /// Puts on the wire what the reliability state wants sent, oldest first,
    /// while send credits last; data waits in the backlog for credits.
    fn flush_transmits(&mut self, now: Instant) {
        while self.sd_wqe > 0 {
            let Some(tx) = self.tx_backlog.pop_front() else {
                break;
            };
            self.transmit(tx);
        }
        loop {
            let Some(rel) = self.rel.as_mut() else { return };
            let Some(tx) = rel.poll_transmit(now) else {
                break;
            };
            if tx.frag.is_some() && (self.sd_wqe == 0 || !self.tx_backlog.is_empty()) {
                self.tx_backlog.push_back(tx);
            } else {
                self.transmit(tx);
            }
        }
    }

    fn transmit(&mut self, tx: udbtl_reliability::Transmit<Descriptor>) {
        let Some(Some(endpoint)) = self.endpoints.get(tx.peer.0 as usize) else {
            return;
        };
        let (ah, remote_qpn) = (endpoint.ah, endpoint.remote.qpn);
        let mut header = tx.header;
        header.src = self.proc_id;
        if self.checksum {
            header.flags |= rel::FLAG_CHECKSUM;
        }
        match tx.frag {
            Some(des) => self.transmit_data(des, header),
            None => self.transmit_ack(ah, remote_qpn, header),
        }
    }

    /// Writes the reliability header into a descriptor and posts it.
    fn transmit_data(&mut self, des: Descriptor, mut header: rel::Repr) {
        let Some(frag) = self.pool(des).frag(des) else {
            return;
        };
        header.flags |= frag.msg_flags;
        let (seg_len, user) = (frag.seg_len, frag.user.clone());
        let Some((mr, sge)) = self.pool(des).sge(des.index(), self.header_len + seg_len) else {
            return;
        };
        let Ok(bytes) = self.ctx.mr_bytes_mut(mr.handle) else {
            return;
        };
        let head = &mut bytes[sge.offset..sge.offset + sge.len];
        header.checksum = 0;
        header.emit(&mut rel::Packet::new_unchecked(
            &mut head[btl::HEADER_LEN..HEADER_MAX],
        ));
        if header.has(rel::FLAG_CHECKSUM) {
            let user_bytes = user.as_ref().map_or(&[][..], |u| &u.data[u.range.clone()]);
            let sum = checksum(&[head, user_bytes]);
            rel::Packet::new_unchecked(&mut head[btl::HEADER_LEN..HEADER_MAX]).set_checksum(sum);
        }
        if self.post(des).is_err() {
            // A refusal is a loss to the protocol: the retransmission timer
            // repairs it.
            self.stats.transmit_failures += 1;
        }
    }

    /// Sends an acknowledgement-only datagram from the ack ring, unsignaled:
    /// it needs no completion and no send credit.
    fn transmit_ack(&mut self, ah: udbtl_fabric::AhHandle, remote_qpn: u32, mut header: rel::Repr) {
        let offset = (self.ack_next % ACK_SLOTS) * ACK_LEN;
        self.ack_next = self.ack_next.wrapping_add(1);
        let Ok(bytes) = self.ctx.mr_bytes_mut(self.ack_mr.handle) else {
            return;
        };
        let buf = &mut bytes[offset..offset + ACK_LEN];
        btl::Repr {
            tag: 0,
            job_key: self.job_key,
            reliable: true,
        }
        .emit(&mut btl::Packet::new_unchecked(&mut buf[..btl::HEADER_LEN]));
        header.checksum = 0;
        header.emit(&mut rel::Packet::new_unchecked(&mut buf[btl::HEADER_LEN..]));
        if header.has(rel::FLAG_CHECKSUM) {
            let sum = checksum(&[buf]);
            rel::Packet::new_unchecked(&mut buf[btl::HEADER_LEN..]).set_checksum(sum);
        }
        let sg = [Gather::Registered(Sge {
            lkey: self.ack_mr.lkey,
            offset,
            len: ACK_LEN,
        })];
        let mut flags = SendFlags::NONE;
        if ACK_LEN <= self.limits.inline_max {
            flags = flags | SendFlags::INLINE;
        }
        let qp = self.qps[(self.qp_next as usize) % NUM_QP].handle;
        self.qp_next = self.qp_next.wrapping_add(1);
        let wr = SendWr {
            wr_id: u64::MAX,
            sg_list: &sg,
            ah,
            remote_qpn,
            remote_qkey: self.qkey,
            imm: None,
            flags,
        };
        if self.ctx.post_send(qp, &[wr]).is_err() {
            self.stats.transmit_failures += 1;
        }
    }

    /// A received reliable datagram in `slot`.
    pub(super) fn on_reliable_receive(&mut self, slot: u32, len: usize, src: QpAddr) {
        let parsed = self.received(slot, len).and_then(|datagram| {
            let ext = datagram.get(btl::HEADER_LEN..HEADER_MAX)?;
            let header = rel::Repr::parse(&rel::Packet::new_checked(ext).ok()?).ok()?;
            Some((
                header,
                !header.has(rel::FLAG_CHECKSUM) || verify_checksum(datagram, header.checksum),
            ))
        });
        let Some((header, intact)) = parsed else {
            self.stats.recv_malformed += 1;
            self.repost(slot);
            return;
        };
        if !intact {
            self.stats.recv_bad_checksum += 1;
            self.repost(slot);
            return;
        }
        let endpoint = match self.last_sender {
            Some((addr, endpoint)) if addr == src => Some(endpoint),
            _ => {
                let endpoint = self.by_addr.get(&src).copied();
                self.last_sender = endpoint.map(|ep| (src, ep));
                endpoint
            }
        };
        let known = endpoint.and_then(|ep| {
            self.endpoints
                .get(ep.0 as usize)?
                .as_ref()
                .map(|e| e.proc_id)
        });
        let Some(endpoint) = endpoint.filter(|_| known == Some(header.src)) else {
            self.stats.recv_unknown_peer += 1;
            // A process that knows us before we know it (addresses fetched
            // lazily): the caller can look it up by the id it carries; the
            // sender retransmits once it is connected.
            if endpoint.is_none()
                && self.unknown_peers.len() < UNKNOWN_PEERS_MAX
                && !self.unknown_peers.contains(&header.src)
            {
                self.unknown_peers.push(header.src);
            }
            self.repost(slot);
            return;
        };
        let now = self.clock;
        let Some(rel) = self.rel.as_mut() else { return };
        match rel.on_datagram(now, PeerId(endpoint.0), &header, slot) {
            Receipt::Deliver(slot) => {
                self.deliver_in_order(slot, len, endpoint, header.flags);
                while let Some((peer, slot)) = self.rel.as_mut().and_then(Reliability::poll_deliver)
                {
                    let (len, flags) = self.buffered_length(slot);
                    self.deliver_in_order(slot, len, EndpointId(peer.0), flags);
                }
            }
            Receipt::Buffered => self.note_buffered(slot, len, header.flags),
            Receipt::Discard(slot, _) => self.repost(slot),
        }
    }

    /// Records a buffered datagram's length and flags in its buffer's GRH
    /// area (bytes the fabric leaves untouched), for its later delivery.
    fn note_buffered(&mut self, slot: u32, len: usize, flags: u16) {
        let start = slot as usize * self.recv_stride;
        if let Ok(bytes) = self.ctx.mr_bytes_mut(self.recv_mr.handle) {
            if let Some(note) = bytes.get_mut(start..start + 6) {
                note[..4].copy_from_slice(&(len as u32).to_be_bytes());
                note[4..].copy_from_slice(&flags.to_be_bytes());
            }
        }
    }

    /// Length and reliability flags of a datagram held while buffered: the
    /// completion that reported its length is gone, so it is kept in the
    /// buffer's GRH area, which the fabric leaves to the BTL.
    fn buffered_length(&self, slot: u32) -> (usize, u16) {
        let start = slot as usize * self.recv_stride;
        let note = self
            .ctx
            .mr_bytes(self.recv_mr.handle)
            .ok()
            .and_then(|b| b.get(start..start + 8))
            .map(|b| {
                (
                    u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
                    u16::from_be_bytes([b[4], b[5]]),
                )
            });
        note.map_or((0, 0), |(len, flags)| (len as usize, flags))
    }

    /// Delivers one in-order datagram, reassembling multi-datagram messages,
    /// and reposts its buffer.
    fn deliver_in_order(&mut self, slot: u32, len: usize, endpoint: EndpointId, flags: u16) {
        let Some(datagram) = self.received(slot, len) else {
            self.repost(slot);
            return;
        };
        let tag = datagram.get(1).copied().unwrap_or(0);
        let src = self
            .endpoints
            .get(endpoint.0 as usize)
            .and_then(|e| e.as_ref())
            .map(|e| e.remote);
        let Some(src) = src else {
            self.repost(slot);
            return;
        };
        let whole = rel::FLAG_FIRST | rel::FLAG_LAST;
        if flags & whole == whole {
            self.deliver(slot, len, HEADER_MAX, tag, Some(endpoint), src);
        } else {
            let payload = datagram.get(HEADER_MAX..).unwrap_or_default().to_vec();
            let entry = self
                .reassembly
                .entry(endpoint.0)
                .or_insert_with(|| (tag, Vec::new()));
            if flags & rel::FLAG_FIRST != 0 {
                entry.0 = tag;
                entry.1.clear();
            }
            entry.1.extend_from_slice(&payload);
            if flags & rel::FLAG_LAST != 0 {
                self.deliver_reassembled(endpoint, src);
            }
        }
        self.repost(slot);
    }

    fn deliver_reassembled(&mut self, endpoint: EndpointId, src: QpAddr) {
        let Some((tag, bytes)) = self.reassembly.get_mut(&endpoint.0) else {
            return;
        };
        let tag = *tag;
        let message = std::mem::take(bytes);
        let endpoint_context = self.endpoint_context(Some(endpoint));
        match self.callbacks[usize::from(tag)].as_mut() {
            Some(callback) => {
                callback(&super::RecvEvent {
                    tag: crate::Tag(tag),
                    endpoint: Some(endpoint),
                    endpoint_context,
                    src,
                    payload: &message,
                });
                self.stats.recvs_delivered += 1;
                self.stats.messages_reassembled += 1;
            }
            None => self.stats.recv_no_callback += 1,
        }
        // Keep the allocation for the next message.
        if let Some((_, bytes)) = self.reassembly.get_mut(&endpoint.0) {
            *bytes = message;
            bytes.clear();
        }
    }

    /// Releases descriptors the reliability state still holds (finalize).
    pub(super) fn abandon_in_flight(&mut self) {
        let live: Vec<Descriptor> = self
            .send_frags
            .live()
            .map(|(i, f)| (i, f, false))
            .chain(self.user_frags.live().map(|(i, f)| (i, f, true)))
            .filter(|(_, f, _)| f.state == FragState::Posted)
            .filter_map(|(i, _, user)| {
                let pool = if user {
                    &self.user_frags
                } else {
                    &self.send_frags
                };
                pool.descriptor_at(i)
            })
            .collect();
        for des in live {
            self.release(des);
        }
        self.tx_backlog.clear();
    }

    /// Process ids (as published in the modex) of senders this module does
    /// not know yet, collected since the last call. A caller that fetches
    /// addresses lazily connects to them; their retransmissions are then
    /// accepted.
    pub fn take_unknown_peers(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.unknown_peers)
    }

    /// This module's process id, as published in the modex and carried in
    /// every reliable datagram.
    pub const fn process_id(&self) -> u32 {
        self.proc_id
    }

    /// Descriptors sent reliably and not yet acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_some())
            .filter_map(|(i, _)| self.rel.as_ref()?.queued(PeerId(i as u32)))
            .map(|(in_flight, backlog)| in_flight + backlog)
            .sum()
    }

    /// Progresses until every reliable send is acknowledged, or `limit`
    /// passes; returns whether everything was acknowledged.
    pub fn quiesce(&mut self, limit: Duration) -> bool {
        let end = std::time::Instant::now() + limit;
        while self.unacknowledged() > 0 {
            if std::time::Instant::now() >= end {
                return false;
            }
            self.progress();
        }
        true
    }

    /// Marks whether a descriptor starts and/or ends a message, for
    /// messages sent as several descriptors (the receiver delivers them as
    /// one). By default a descriptor is a whole message.
    ///
    /// # Errors
    /// A stale descriptor.
    pub fn set_message_bounds(
        &mut self,
        des: Descriptor,
        first: bool,
        last: bool,
    ) -> Result<(), BtlError> {
        let frag = self
            .pool_mut(des)
            .frag_mut(des)
            .ok_or_else(|| Self::bad(des, "not allocated"))?;
        frag.msg_flags =
            if first { rel::FLAG_FIRST } else { 0 } | if last { rel::FLAG_LAST } else { 0 };
        Ok(())
    }

    /// Sends `message`, of any length, to `endpoint`: it is cut into
    /// datagrams that the receiver reassembles and delivers to the `tag`
    /// callback once, whole. Requires a reliable module (reassembly relies
    /// on in-order, exactly-once delivery). Waits, progressing, for free
    /// fragments.
    ///
    /// # Errors
    /// An unreliable module, an unknown or lost endpoint.
    pub fn send_message(
        &mut self,
        endpoint: EndpointId,
        tag: crate::Tag,
        message: &[u8],
    ) -> Result<(), BtlError> {
        if self.rel.is_none() {
            return Err(BtlError::PeerUnavailable {
                endpoint: endpoint.0,
                reason: "multi-datagram messages need reliable = true".into(),
            });
        }
        let chunk = self.limits.eager_limit.max(1);
        let pieces = message.len().div_ceil(chunk).max(1);
        for (i, piece) in message
            .chunks(chunk)
            .chain(message.is_empty().then_some(&[][..]))
            .enumerate()
        {
            let des = loop {
                if let Some(des) =
                    self.alloc(crate::NO_ORDER, piece.len(), crate::DesFlags::BTL_OWNERSHIP)
                {
                    break des;
                }
                self.progress();
            };
            self.segment_mut(des)?.copy_from_slice(piece);
            self.set_message_bounds(des, i == 0, i + 1 == pieces)?;
            self.send(endpoint, des, tag)?;
        }
        Ok(())
    }
}

/// CRC-32 over `parts`, as carried in the reliability header.
fn checksum(parts: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

/// Recomputes a received datagram's checksum with its field zeroed.
fn verify_checksum(datagram: &[u8], expected: u32) -> bool {
    let field =
        btl::HEADER_LEN + rel::CHECKSUM_FIELD.start..btl::HEADER_LEN + rel::CHECKSUM_FIELD.end;
    let (Some(before), Some(after)) = (datagram.get(..field.start), datagram.get(field.end..))
    else {
        return false;
    };
    checksum(&[before, &[0; 4], after]) == expected
}
