//! The receiving side: the receive window, buffering datagrams that
//! arrive early, in-order delivery, duplicates, refusal for want of room,
//! and when an acknowledgement is owed.

use std::time::Duration;

use udbtl_wire::SeqNum;
use udbtl_wire::rel::{self, FLAG_ACK_ONLY, FLAG_ACK_REQ, FLAG_ECHO, FLAG_RESET};

use super::timer_table::Timer;
use super::types::{Discard, LossReason, Mode, PeerId, Receipt, Room};
use super::{Pending, Reliability};
use crate::config::SACK_SPAN;
use crate::time::Instant;

/// One peer's receiving state: the receive window (the next sequence
/// number expected and which later ones are buffered) and the
/// acknowledgement owed to the peer.
#[derive(Debug, Clone)]
pub(super) struct RecvState {
    /// Next sequence number expected from the peer.
    pub(super) nxt: SeqNum,
    /// Bit `i`: `nxt + 1 + i` arrived and is buffered.
    pub(super) sack: u64,
    /// Datagrams buffered further ahead than `sack` can say (past
    /// `nxt + 64`, within the window). The cumulative acknowledgement
    /// covers them once the gap before them fills; until then only this
    /// side knows, and each enters `sack` as `nxt` comes within 64 of it.
    pub(super) beyond_sack: u16,
    /// Datagrams received since the last acknowledgement went out.
    pub(super) ack_pending: u16,
    /// An acknowledgement must go out at the next transmit opportunity.
    pub(super) ack_now: bool,
    /// An acknowledgement is queued for transmission.
    pub(super) ack_queued: bool,
    /// The next acknowledgement-only datagram echoes `echo`: the peer
    /// probed (see [`FLAG_ECHO`](rel::FLAG_ECHO)).
    pub(super) echo_owed: bool,
    /// The `seq` of the peer's last probe.
    pub(super) echo: SeqNum,
    /// The right edge of the credit last advertised: `nxt` plus that
    /// credit. Between `nxt` and it lie buffers promised to the peer.
    pub(super) granted: SeqNum,
}

impl RecvState {
    /// Nothing received yet: `initial` is expected first.
    pub(super) const fn new(initial: SeqNum) -> Self {
        Self {
            nxt: initial,
            sack: 0,
            beyond_sack: 0,
            ack_pending: 0,
            ack_now: false,
            ack_queued: false,
            echo_owed: false,
            echo: SeqNum(0),
            granted: initial,
        }
    }
}

impl<F: Clone, R> Reliability<F, R> {
    /// Handles a received datagram's reliability header; `buf` is the
    /// buffer holding it and `room` what the caller can take of its data.
    /// Acknowledgements it carries are processed first, whatever the room.
    ///
    /// * A datagram whose acknowledgement the peer could not have sent (of
    ///   data never sent, or further back than a window) is dropped
    ///   ([`Discard::Unacceptable`]), whatever else it carries (RFC 5961
    ///   §5).
    /// * Any other shows the peer alive, and restarts its failure clock;
    ///   with [`Config::strict_liveness`](crate::Config::strict_liveness),
    ///   only news does: data not received before, an acknowledgement of
    ///   data not acknowledged before, or the answer to a probe
    ///   (`FLAG_ECHO`), which shows it alive since the probe was sent.
    /// * Data the room does not allow is refused
    ///   ([`Discard::NoRoom`]): not acknowledged (the sender retransmits
    ///   it), but an acknowledgement goes out at once with the current
    ///   credit.
    /// * An acknowledgement-only datagram that asks for one
    ///   (`FLAG_ACK_REQ`, such as a zero-window probe) is answered.
    /// * A reset ([`rel::FLAG_RESET`]) declares the peer lost
    ///   ([`LossReason::Reset`]) only at the next sequence number expected
    ///   from it (RFC 5961 §3). Elsewhere in the receive window it draws a
    ///   challenge acknowledgement, which a peer that did reset answers with
    ///   a reset at that number; outside, it is only counted.
    /// * A peer already declared lost is answered with a reset when it sends
    ///   data or asks for an acknowledgement, never otherwise. The reset
    ///   carries the datagram's acknowledgement number as its sequence
    ///   number: the one the peer accepts.
    pub fn on_datagram(
        &mut self,
        now: Instant,
        peer: PeerId,
        header: &rel::Repr,
        buf: R,
        room: Room,
    ) -> Receipt<R> {
        if !self.wake(now, peer.0) {
            return Receipt::Discard(buf, Discard::PeerLost);
        }
        let p = &mut self.peers[peer.0 as usize];
        if let Mode::Lost(reset_seq) = &mut p.mode {
            // It still believes the streams alive: tell it they are broken.
            // A reset or a plain acknowledgement gets no answer, so two
            // sides that lost each other cannot loop.
            if !header.has(FLAG_RESET) && (!header.has(FLAG_ACK_ONLY) || header.has(FLAG_ACK_REQ)) {
                *reset_seq = header.ack;
                self.transmits.push_back(Pending::Reset(peer.0));
            }
            return Receipt::Discard(buf, Discard::PeerLost);
        }
        if header.has(FLAG_RESET) {
            return self.on_reset(now, peer.0, header, buf);
        }
        let window = i32::from(self.config.window);
        if header.ack.is_after(p.snd_nxt) || header.ack - p.snd_una < -window {
            // Forged, corrupt or from another incarnation: whatever it
            // carries, it says nothing of the peer.
            self.stats.unacceptable_acks += 1;
            return Receipt::Discard(buf, Discard::Unacceptable);
        }
        if !self.config.strict_liveness {
            p.last_heard = now;
        } else if header.has(FLAG_ECHO) {
            // The answer to a probe: alive since the probe went, whenever
            // this copy of the answer was sent.
            if let Some(probed) = probe_sent_at(header.seq, now, self.config.peer_timeout) {
                p.last_heard = p.last_heard.max(probed);
            }
        }
        self.on_ack(now, peer.0, header);
        if header.has(FLAG_ACK_ONLY) {
            if header.has(FLAG_ACK_REQ) {
                // A probe: its answer echoes its token.
                let p = &mut self.peers[peer.0 as usize];
                p.rcv.echo = header.seq;
                p.rcv.echo_owed = true;
                self.queue_ack(peer.0);
            }
            self.reschedule(peer.0);
            return Receipt::Discard(buf, Discard::AckOnly);
        }
        let receipt = self.on_data(now, peer.0, header, buf, room);
        if self.config.strict_liveness
            && !matches!(
                receipt,
                Receipt::Discard(_, Discard::Duplicate | Discard::OutOfWindow)
            )
        {
            // Data not received before (even if refused for want of room).
            self.peers[peer.0 as usize].last_heard = now;
        }
        self.reschedule(peer.0);
        receipt
    }

    /// A reset from an active peer: it ends the streams only at the exact
    /// next sequence number expected (RFC 5961 §3.2).
    fn on_reset(&mut self, now: Instant, peer: u32, header: &rel::Repr, buf: R) -> Receipt<R> {
        let window = i32::from(self.config.window);
        let rto_min = self.config.rto_min;
        let offset = header.seq - self.peers[peer as usize].rcv.nxt;
        if offset == 0 {
            self.declare_lost(peer, LossReason::Reset);
            return Receipt::Discard(buf, Discard::PeerLost);
        }
        self.stats.unacceptable_resets += 1;
        let challenge_due = self.last_challenge.is_none_or(|at| now >= at + rto_min);
        if offset > 0 && offset < window && challenge_due {
            // Perhaps the peer reset after data of its that never arrived:
            // asked for an acknowledgement, it answers with a reset at the
            // number this side expects.
            self.last_challenge = Some(now);
            self.stats.challenge_acks += 1;
            self.queue_probe(peer);
        }
        Receipt::Discard(buf, Discard::Unacceptable)
    }

    /// Refuses a data datagram for want of room: not acknowledged, but the
    /// sender hears the current credit at once.
    pub(super) fn refuse(&mut self, peer: u32, buf: R) -> Receipt<R> {
        self.stats.refused_no_room += 1;
        self.queue_ack(peer);
        Receipt::Discard(buf, Discard::NoRoom)
    }

    pub(super) fn on_data(
        &mut self,
        now: Instant,
        peer: u32,
        header: &rel::Repr,
        buf: R,
        room: Room,
    ) -> Receipt<R> {
        let seq = header.seq;
        let window = i32::from(self.config.window);
        self.note_sender(peer);
        let p = &mut self.peers[peer as usize];
        let offset = seq - p.rcv.nxt;
        p.last_data = Some(now);
        if header.has(FLAG_ACK_REQ) {
            p.rcv.ack_now = true;
        }
        if offset < 0 {
            // Our acknowledgement was lost, or the datagram was duplicated:
            // acknowledge again so the sender stops.
            self.stats.duplicates += 1;
            self.queue_ack(peer);
            return Receipt::Discard(buf, Discard::Duplicate);
        }
        if offset >= window {
            self.stats.out_of_window += 1;
            self.queue_ack(peer);
            return Receipt::Discard(buf, Discard::OutOfWindow);
        }
        if offset > SACK_SPAN {
            // Further ahead of a gap than the selective ACK can say: kept
            // all the same, so that the sender resends only what is missing.
            if self.early.contains_key(&(peer, seq.0)) {
                self.stats.duplicates += 1;
                self.queue_ack(peer);
                return Receipt::Discard(buf, Discard::Duplicate);
            }
            if !room.early {
                return self.refuse(peer, buf);
            }
            p.rcv.beyond_sack += 1;
            self.early.insert((peer, seq.0), buf);
            self.stats.out_of_order += 1;
            self.stats.received += 1;
            self.queue_ack(peer);
            return Receipt::Buffered;
        }
        if offset > 0 {
            let bit = 1u64 << (offset - 1);
            if p.rcv.sack & bit != 0 {
                self.stats.duplicates += 1;
                self.queue_ack(peer);
                return Receipt::Discard(buf, Discard::Duplicate);
            }
            if !room.early {
                return self.refuse(peer, buf);
            }
            p.rcv.sack |= bit;
            self.early.insert((peer, seq.0), buf);
            self.stats.out_of_order += 1;
            self.stats.received += 1;
            // A gap: tell the sender now, so it can fast-retransmit.
            self.queue_ack(peer);
            return Receipt::Buffered;
        }
        if !room.in_order {
            return self.refuse(peer, buf);
        }
        // In order: deliver, then everything buffered behind it.
        self.stats.received += 1;
        let first = p.rcv.nxt;
        p.advance_rcv();
        let mut delivered = 1u16;
        loop {
            // Bit 0 is the new `nxt`; after the shift bit `i` is
            // `nxt + 1 + i` again, and bit 63 comes from what lies beyond.
            let buffered = p.rcv.sack & 1 != 0;
            p.rcv.sack >>= 1;
            if p.rcv.beyond_sack > 0 {
                let entering = p.rcv.nxt + SACK_SPAN as u32;
                if self.early.contains_key(&(peer, entering.0)) {
                    p.rcv.sack |= 1 << 63;
                    p.rcv.beyond_sack -= 1;
                }
            }
            if !buffered {
                break;
            }
            if let Some(early) = self.early.remove(&(peer, p.rcv.nxt.0)) {
                self.deliverable.push_back((PeerId(peer), early));
            }
            p.advance_rcv();
            delivered += 1;
        }
        // Promised buffers these datagrams used are promised no more.
        let used = (p.rcv.granted - first).clamp(0, i32::from(delivered));
        self.credit.used(used as usize);
        p.rcv.ack_pending = p.rcv.ack_pending.saturating_add(delivered);
        if p.rcv.ack_now || p.rcv.ack_pending >= self.config.ack_every {
            self.queue_ack(peer);
        } else if !p.timers.is_set(Timer::Ack) {
            p.timers.set(Timer::Ack, now + self.config.ack_delay);
        }
        Receipt::Deliver(buf)
    }

    /// Buffers that became deliverable, in order, after a
    /// [`Receipt::Deliver`].
    pub fn poll_deliver(&mut self) -> Option<(PeerId, R)> {
        self.deliverable.pop_front()
    }
}

/// A probe's time token counts in units of 2^TOKEN_SHIFT ns (about 1 ms):
/// 32 bits of them last 49 days before they wrap.
const TOKEN_SHIFT: u32 = 20;

/// The token a probe sent at `now` carries as its `seq`: the time, in units
/// of about a millisecond (2²⁰ ns), modulo 2³².
pub(super) fn probe_token(now: Instant) -> SeqNum {
    SeqNum((now.as_nanos() >> TOKEN_SHIFT) as u32)
}

/// When the probe whose token is `token` was sent (rounded down to its
/// unit), if that was at most `horizon` before `now`: an older token, or
/// one from the future, shows nothing.
pub(super) fn probe_sent_at(token: SeqNum, now: Instant, horizon: Duration) -> Option<Instant> {
    let now_units = now.as_nanos() >> TOKEN_SHIFT;
    let age_units = u64::from((now_units as u32).wrapping_sub(token.0));
    let sent = now_units.checked_sub(age_units)? << TOKEN_SHIFT;
    (now.saturating_since(Instant::from_nanos(sent)) <= horizon).then(|| Instant::from_nanos(sent))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{probe_sent_at, probe_token};
    use crate::time::Instant;

    #[test]
    fn a_probe_token_says_when_within_the_horizon_and_never_later() {
        let horizon = Duration::from_secs(30);
        let sent = Instant::from_nanos(5_000_000_123);
        let token = probe_token(sent);
        for later in [0, 1, 999, 29_000] {
            let now = sent + Duration::from_millis(later);
            let at = probe_sent_at(token, now, horizon).expect("within the horizon");
            assert!(at <= sent && sent.saturating_since(at) < Duration::from_millis(2));
        }
        assert_eq!(
            probe_sent_at(token, sent + Duration::from_secs(31), horizon),
            None
        );
        // A token from the future reads as one from 49 days ago.
        assert_eq!(
            probe_sent_at(token, Instant::from_nanos(1_000), horizon),
            None
        );
    }
}
