//! Coalescing: a small whole message rides in the datagram of an earlier
//! one to the same peer that has not left yet, either the newest fragment
//! of a full window's backlog or the open carrier (the small message of a
//! burst, held back until the next progress call). A rider completes right
//! after its carrier. In a burst to one peer, sends that would leave at once
//! may also wait for the next, to share a GSO send with it ([`HOLD_MAX`]).

use udbtl_fabric::Context;
use udbtl_reliability::{Instant, PeerId};
use udbtl_wire::{coalesced, rel};

use super::super::Engine;
use super::super::descriptors::Frags;
use crate::error::SendFailure;
use crate::frag::{DesFlags, Descriptor, FragKind, FragState};

/// Coalescing's own state: whether it is on, the open carrier of a burst,
/// the riders not completed yet, the scratch a rider's bytes pass through,
/// and the sends a burst to one peer holds back unflushed.
#[derive(Debug)]
pub(in crate::module) struct Coalescer {
    /// The `coalesce` parameter.
    enabled: bool,
    /// A rider's bytes on their way into its carrier (both live in
    /// registered memory, possibly of one registration): reserved once, at
    /// the eager limit, so that coalescing never allocates.
    scratch: Vec<u8>,
    /// Messages riding in another's datagram, not yet completed: the
    /// reliability state counts only the carriers.
    riders_waiting: usize,
    /// A small message sent in a burst (no progress call since the previous
    /// send), held back so that the burst's next small messages to the same
    /// peer ride in its datagram. It reaches the reliability state at the
    /// next progress call, or at the first send it cannot carry.
    open_carrier: Option<Descriptor>,
    /// The peer of the last send since the last progress call: the next
    /// send is part of a burst, and may follow one to the same peer.
    burst_peer: Option<u32>,
    /// Sends of a burst to one peer sequenced into the reliability state
    /// without a flush (closed carriers, trains): they leave together, in
    /// GSO sends where the fabric can join them, once [`HOLD_MAX`] wait, at
    /// a send to another peer or at the next flush.
    held: usize,
}

/// Sends to one peer that may wait for the next: three 16 KiB messages
/// fill one GSO send at MTU 1500 (`udp/segment`), three 32 KiB ones two.
/// Open MPI bandwidth across the veth at MTU 1500 with all of a burst held
/// until the next progress call, 2026-12-06: 1.5-2.3 times as fast from 4
/// to 16 KiB. Bounded, and only for one peer, so that a burst to several
/// peers (a halo exchange before a computation) leaves as it is sent.
const HOLD_MAX: usize = 2;

impl Coalescer {
    /// Coalescing on or off, for datagrams of up to `eager_limit` payload
    /// bytes.
    pub(in crate::module) fn new(enabled: bool, eager_limit: usize) -> Self {
        Self {
            enabled,
            scratch: Vec::with_capacity(if enabled { eager_limit } else { 0 }),
            riders_waiting: 0,
            open_carrier: None,
            burst_peer: None,
            held: 0,
        }
    }

    /// Whether a send just sequenced without a flush (a closed carrier, a
    /// train) may wait in the reliability state for the next, its burst
    /// going on to the same peer (`same_peer`); counts it if so.
    pub(in crate::module) fn hold(&mut self, same_peer: bool) -> bool {
        let hold = same_peer && self.held < HOLD_MAX;
        self.held = if hold { self.held + 1 } else { 0 };
        hold
    }

    /// Whether sends wait unflushed.
    pub(in crate::module) const fn holds(&self) -> bool {
        self.held > 0
    }

    /// A flush: nothing sequenced is held any more.
    pub(in crate::module) fn flushed(&mut self) {
        self.held = 0;
    }

    pub(in crate::module) const fn enabled(&self) -> bool {
        self.enabled
    }

    /// Notes a send to `peer`; returns the peer of the burst's previous
    /// send, if it is part of a burst (another send came since the last
    /// progress call).
    pub(in crate::module) fn note_send(&mut self, peer: u32) -> Option<u32> {
        self.burst_peer.replace(peer)
    }

    /// A progress call: the burst is over.
    pub(in crate::module) fn end_burst(&mut self) {
        self.burst_peer = None;
    }

    /// The open carrier, if there is one.
    pub(in crate::module) const fn open_carrier(&self) -> Option<Descriptor> {
        self.open_carrier
    }

    /// Holds `des` back as the open carrier.
    pub(in crate::module) fn open(&mut self, des: Descriptor) {
        self.open_carrier = Some(des);
    }

    /// Messages held here: the open carrier and the riders not completed.
    pub(in crate::module) fn holding(&self) -> usize {
        usize::from(self.open_carrier.is_some()) + self.riders_waiting
    }

    /// Packs the whole message in `des` into the datagram of `carrier`, a
    /// fragment to `peer` that has never been sequenced nor transmitted (the
    /// open carrier, or the newest of the peer's backlog), if both fit in
    /// `eager_limit` payload bytes behind `header_len` header bytes.
    /// On success `des` becomes the carrier's last rider: Posted, owned by
    /// the BTL until the carrier's acknowledgement (or failure) completes it
    /// right after the carrier. On refusal nothing changed.
    ///
    /// Eligible are send fragments with their bytes in BTL registered memory
    /// (no lent or user bytes), holding a whole message no longer than a
    /// record may be; the carrier must also be BTL-owned (it is freed after
    /// its callback, so its rewritten segment is never seen again).
    pub(in crate::module) fn ride<C: Context>(
        &mut self,
        ctx: &mut C,
        frags: &mut Frags,
        (header_len, eager_limit): (usize, usize),
        carrier: Descriptor,
        peer: PeerId,
        des: Descriptor,
    ) -> bool {
        let (Some(c), Some(r)) = (frags.get(carrier), frags.get(des)) else {
            return false;
        };
        if carrier == des
            || des.kind() != FragKind::Send
            || c.state != FragState::Posted
            || !may_ride(r)
            || !may_carry(frags, peer, carrier)
        {
            return false;
        }
        let packed = c.msg_flags & rel::FLAG_COALESCED != 0;
        let list_len = if packed {
            c.seg_len
        } else {
            coalesced::record_len(c.seg_len)
        };
        if list_len + coalesced::record_len(r.seg_len) > eager_limit {
            return false;
        }
        let (c_len, c_tag, c_tail, r_len, r_tag) =
            (c.seg_len, c.tag, c.rider_tail, r.seg_len, r.tag);
        // The rider's bytes go through the scratch buffer: the two fragments
        // may share a registration, which cannot be borrowed twice.
        let Some((r_mr, r_sge)) = frags.head(des, header_len + r_len) else {
            return false;
        };
        let Some(bytes) = ctx
            .mr_bytes(r_mr.handle)
            .ok()
            .and_then(|b| b.get(r_sge.offset + header_len..r_sge.offset + r_sge.len))
        else {
            return false;
        };
        self.scratch.clear();
        self.scratch.extend_from_slice(bytes);
        let Some((c_mr, c_sge)) = frags.head(carrier, header_len + eager_limit) else {
            return false;
        };
        let Some(list) = ctx
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
        let Ok(end) = start.and_then(|at| coalesced::append(list, at, r_tag, &self.scratch)) else {
            // Only on a fragment stride shorter than the eager limit, which
            // the build never makes; the carrier is then as it was.
            return false;
        };
        if let Some(c) = frags.get_mut(carrier) {
            c.seg_len = end;
            c.segment_crc = None;
            c.msg_flags |= rel::FLAG_COALESCED;
            c.rider_tail = Some(des);
            if c_tail.is_none() {
                c.rider = Some(des);
            }
        }
        if let Some(tail) = c_tail.and_then(|t| frags.get_mut(t)) {
            tail.rider = Some(des);
        }
        if let Some(r) = frags.get_mut(des) {
            r.rider = None;
            r.rider_tail = None;
            r.state = FragState::Posted;
        }
        self.riders_waiting += 1;
        true
    }
}

/// Coalescing, on the engine's fragments and its open carrier.
impl<C: Context> Engine<C> {
    /// Hands the open carrier, with its riders, to the reliability state;
    /// says whether there was one. Not flushed: the caller flushes. A peer
    /// that can no longer be sent to fails the carrier and its riders.
    pub(in crate::module) fn close_open_carrier(&mut self, now: Instant) -> bool {
        let Some(des) = self.coalescer.open_carrier.take() else {
            return false;
        };
        let peer = PeerId(self.frags.get(des).map_or(u32::MAX, |f| f.endpoint));
        if let Err(err) = self.sequence(now, peer, des, false) {
            self.complete_with_riders(des, Err(SendFailure::Refused(err.to_string())));
        }
        true
    }

    /// Completes a descriptor and then, in order, the messages that rode in
    /// its datagram, with the same status.
    pub(in crate::module) fn complete_with_riders(
        &mut self,
        des: Descriptor,
        status: Result<(), SendFailure>,
    ) {
        let mut next = self.frags.get_mut(des).and_then(|f| {
            f.rider_tail = None;
            f.rider.take()
        });
        self.complete_send(des, status.clone());
        while let Some(rider) = next {
            next = self.frags.get_mut(rider).and_then(|f| f.rider.take());
            self.coalescer.riders_waiting = self.coalescer.riders_waiting.saturating_sub(1);
            self.complete_send(rider, status.clone());
        }
    }
}

/// Whether `des` may carry later messages to `peer` in its datagram: the
/// conditions [`Coalescer::ride`] puts on a carrier.
pub(in crate::module) fn may_carry(frags: &Frags, peer: PeerId, des: Descriptor) -> bool {
    des.kind() == FragKind::Send
        && frags.get(des).is_some_and(|f| {
            f.flags.contains(DesFlags::BTL_OWNERSHIP) && f.endpoint == peer.0 && may_ride(f)
        })
}

/// Whether a fragment's message may travel as a record of a coalesced
/// datagram: whole, not aborted, not the read protocol's, in BTL memory,
/// short enough for a record.
pub(in crate::module) fn may_ride(f: &crate::frag::Frag) -> bool {
    let whole = rel::FLAG_FIRST | rel::FLAG_LAST;
    f.user.is_none()
        && f.msg_flags & (whole | rel::FLAG_ABORT | rel::FLAG_READ) == whole
        && f.seg_len <= coalesced::MAX_RECORD_LEN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_one_peer_wait_in_threes_and_others_never() {
        let mut coalescer = Coalescer::new(true, 1024);
        // To one peer: two wait, the third releases them all.
        assert!(coalescer.hold(true));
        assert!(coalescer.hold(true));
        assert!(!coalescer.hold(true));
        assert!(coalescer.hold(true));
        // Another peer next: nothing waits, and the count starts again.
        assert!(!coalescer.hold(false));
        assert!(coalescer.hold(true));
        // A flush leaves nothing held.
        coalescer.flushed();
        assert!(coalescer.hold(true));
        assert!(coalescer.hold(true));
        assert!(!coalescer.hold(true));
    }
}
