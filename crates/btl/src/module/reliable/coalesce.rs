//! Coalescing: a small whole message rides in the datagram of an earlier
//! one to the same peer that has not left yet, either the newest fragment
//! of a full window's backlog or the open carrier (the small message of a
//! burst, held back until the next progress call). A rider completes right
//! after its carrier.

use udbtl_fabric::Context;
use udbtl_reliability::{Instant, PeerId};
use udbtl_wire::{coalesced, rel};

use super::super::Engine;
use crate::error::SendFailure;
use crate::frag::{DesFlags, Descriptor, FragKind, FragState};

/// Coalescing, on the engine's fragments and its open carrier.
impl<C: Context> Engine<C> {
    /// Hands the open carrier, with its riders, to the reliability state;
    /// says whether there was one. Not flushed: the caller flushes. A peer
    /// that can no longer be sent to fails the carrier and its riders.
    pub(in crate::module) fn close_open_carrier(&mut self, now: Instant) -> bool {
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
    pub(in crate::module) fn may_carry(&self, peer: PeerId, des: Descriptor) -> bool {
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
    pub(in crate::module) fn ride(
        &mut self,
        carrier: Descriptor,
        peer: PeerId,
        des: Descriptor,
    ) -> bool {
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
            self.riders_waiting = self.riders_waiting.saturating_sub(1);
            self.complete_send(rider, status.clone());
        }
    }
}

/// Whether a fragment's message may travel as a record of a coalesced
/// datagram: whole, not aborted, in BTL memory, short enough for a record.
pub(in crate::module) fn may_ride(f: &crate::frag::Frag) -> bool {
    let whole = rel::FLAG_FIRST | rel::FLAG_LAST;
    f.user.is_none()
        && f.msg_flags & (whole | rel::FLAG_ABORT) == whole
        && f.seg_len <= coalesced::MAX_RECORD_LEN
}
