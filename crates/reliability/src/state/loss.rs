//! Loss detection: time-based (RACK, RFC 8985) and by duplicate threshold,
//! the tail-loss probe, the retransmission timeout, and the congestion
//! response to loss.

use std::time::Duration;

use udbtl_wire::SeqNum;

use super::peer::{CWND_UNIT, LOST, NIL, Peer, QUEUED, RETRANSMITTED, SACKED, SENT};
use super::recv::probe_token;
use super::timer_table::{Timer, earliest};
use super::{Pending, Reliability};
use crate::time::Instant;

/// The shortest tail-loss probe timeout: below it, timer granularity and
/// scheduling noise would make most probes spurious.
const PTO_MIN: Duration = Duration::from_micros(10);

impl Peer {
    /// Notes that a datagram sent at `sent_at` was delivered (acknowledged
    /// cumulatively or selectively) at `now`, for RACK. Returns `true` if it
    /// was a retransmission acknowledged well within the shortest round trip
    /// seen (under three quarters of it): the acknowledgement was for the
    /// first transmission, so the retransmission was spurious, and it says
    /// nothing about when the newest delivered datagram was sent. The margin
    /// matters: the shortest round trip seen may include a little queueing,
    /// and a retransmission's own acknowledgement over an emptied path
    /// comes back a little sooner; taken for spurious, it would keep RACK
    /// from ever seeing the rest of a lost flight, and every datagram of it
    /// would wait for a timeout of its own.
    pub(super) fn rack_delivered(&mut self, now: Instant, sent_at: Instant, flags: u8) -> bool {
        let rtt = u32::try_from(now.saturating_since(sent_at).as_nanos()).unwrap_or(u32::MAX);
        if flags & RETRANSMITTED != 0 && u64::from(rtt) * 4 < u64::from(self.min_rtt_ns) * 3 {
            return true;
        }
        if sent_at >= self.rack_sent {
            self.rack_sent = sent_at;
            self.rack_rtt_ns = rtt.max(1);
        }
        false
    }

    /// The retransmission timeout for the datagrams in flight: the measured
    /// one, plus the receiver's delayed acknowledgement `ack_delay` while a
    /// lone datagram is in flight, which nothing makes the receiver
    /// acknowledge sooner (see [`probe_timeout`](Self::probe_timeout)):
    /// `rto_min` may be shorter than the delay.
    pub(super) fn flight_timeout(&self, ack_delay: Duration) -> Duration {
        let rto = self.rtt.rto();
        if self.in_flight == 1 {
            rto + ack_delay
        } else {
            rto
        }
    }

    /// Two smoothed round trips, or the smoothed round trip and four times
    /// its variance if longer, at least [`PTO_MIN`]; the initial timeout
    /// before any sample. With a lone datagram in flight, plus the
    /// receiver's delayed acknowledgement `ack_delay` (RFC 8985 §7.2): no
    /// later datagram makes it acknowledge sooner, and a datagram that
    /// ends a flight of several asks for an acknowledgement at once.
    pub(super) fn probe_timeout(&self, ack_delay: Duration) -> Duration {
        let srtt = self.rtt.srtt();
        if srtt.is_zero() {
            return self.rtt.rto();
        }
        // Where round trips vary a lot (a peer on a shared CPU, answering
        // after a time slice), two smoothed ones are not enough: the probe
        // waits as long as the variance says, as the timeout does.
        let pto = (2 * srtt).max(self.rtt.variance_bound()).max(PTO_MIN);
        if self.in_flight == 1 {
            pto + ack_delay
        } else {
            pto
        }
    }
}

impl<F: Clone, R> Reliability<F, R> {
    /// Marks lost every datagram in flight that RACK finds lost at `now`:
    /// sent before the newest delivered one, not delivered itself, and older
    /// than a round trip plus the reordering window. A retransmission counts
    /// like any send, so a datagram lost again is found again. The earliest
    /// suspect not yet due arms [`Timer::Loss`]. What is lost goes again as
    /// the congestion window allows ([`send_repairs`](Self::send_repairs)).
    ///
    /// Congestion response: each lost datagram takes a quarter datagram off
    /// the congestion window. Random loss at rate `p` then holds the window
    /// near `4 / p` datagrams (80 at 5 %), where halving once per round trip
    /// would hold it near a handful; loss from overflow, which comes in
    /// bursts, still shrinks it fast.
    pub(super) fn detect_losses(&mut self, now: Instant, peer: u32) {
        let p = &mut self.peers[peer as usize];
        p.timers.stop(Timer::Loss);
        if p.rack_rtt_ns == 0 {
            // Nothing delivered yet: nothing to judge by.
            return;
        }
        let reo_wnd = Duration::from_nanos(u64::from(p.min_rtt_ns.min(p.rack_rtt_ns.max(1)) / 4));
        let wait = Duration::from_nanos(u64::from(p.rack_rtt_ns)) + reo_wnd;
        let mut lost = 0u32;
        let mut loss_at = None;
        // Selectively acknowledged datagrams after the one examined: at
        // `dup_threshold` of them a first transmission is lost at once,
        // without waiting out the reordering window.
        let mut sacked_after = u32::from(p.sacked);
        let mut at = p.head;
        while at != NIL {
            let index = at;
            let slot = &mut self.slots[index as usize];
            at = slot.next;
            if slot.flags & SACKED != 0 {
                sacked_after = sacked_after.saturating_sub(1);
                continue;
            }
            if slot.flags & (QUEUED | LOST) != 0 || slot.flags & SENT == 0 {
                continue;
            }
            if slot.flags & RETRANSMITTED == 0 && sacked_after >= self.config.dup_threshold {
                slot.flags |= LOST;
                lost += 1;
                continue;
            }
            if slot.sent_at >= p.rack_sent {
                // Sent after the newest delivered datagram: so is every
                // later first transmission, and every later retransmission.
                if slot.flags & RETRANSMITTED == 0 {
                    break;
                }
                continue;
            }
            let due = slot.sent_at + wait;
            if due <= now {
                slot.flags |= LOST;
                lost += 1;
            } else {
                loss_at = earliest(loss_at, Some(due));
            }
        }
        if let Some(at) = loss_at {
            p.timers.set(Timer::Loss, at);
        }
        if lost > 0 {
            self.stats.fast_retransmits += u64::from(lost);
            p.lost = p.lost.saturating_add(lost as u16);
            p.note_undo();
            let floor = 2 * CWND_UNIT;
            p.cwnd = p.cwnd.saturating_sub(lost * CWND_UNIT / 4).max(floor);
            p.ssthresh = p.cwnd;
        }
        self.send_repairs(peer);
    }

    /// Queues datagrams found lost, oldest first, while the pipe leaves room
    /// in the congestion window: repairs go at the pace acknowledgements
    /// come back, never in a burst past the window (after a timeout, one
    /// datagram, then as slow start allows). They go before new data, which
    /// `fill_window` sends only after them.
    pub(super) fn send_repairs(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        let mut at = p.head;
        while p.lost > 0 && at != NIL && p.pipe_has_room() {
            let slot = &mut self.slots[at as usize];
            if slot.flags & LOST != 0 {
                slot.flags = (slot.flags & !LOST) | QUEUED;
                p.lost -= 1;
                self.transmits.push_back(Pending::Data(at));
            }
            at = slot.next;
        }
    }

    /// Arms the tail-loss probe: while data is in flight and no probe is
    /// out, two smoothed round trips after now (or after the first send,
    /// before any sample, the initial timeout).
    pub(super) fn arm_probe(&mut self, now: Instant, peer: u32) {
        let ack_delay = self.config.ack_delay;
        let p = &mut self.peers[peer as usize];
        if p.head != NIL && !p.probed {
            p.timers.set(Timer::Pto, now + p.probe_timeout(ack_delay));
        } else {
            p.timers.stop(Timer::Pto);
        }
    }

    /// Sends the tail-loss probe: an acknowledgement request, not a resend.
    /// Its answer shows what the peer had by the time the probe left
    /// (RACK takes it for a datagram delivered that was sent then, see
    /// [`on_probe_answer`](Self::on_probe_answer)): a datagram sent a
    /// reordering window before it and still not acknowledged is lost, and
    /// goes again as the congestion window allows. Where nothing was lost,
    /// and the peer only answered late (descheduled on a shared CPU, or
    /// its delayed acknowledgement), the probe cost a header, not a resend
    /// of up to a whole datagram, and the late answer's round trip enters
    /// the estimate, as a resend would have kept it out (Karn's rule).
    pub(super) fn probe_tail(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        if p.head == NIL || p.probed {
            return;
        }
        p.probed = true;
        self.stats.tail_probes += 1;
        self.queue_probe(peer);
    }

    /// An answer from `peer` echoing `token` came in at `now`. If it
    /// answers this side's last probe, everything sent before the probe
    /// either reached the peer or never will (a datagram overtaken by the
    /// probe is covered by RACK's reordering window): for RACK, a datagram
    /// sent when the probe left was delivered. Call before
    /// [`detect_losses`](Self::detect_losses), which then finds what the
    /// answer shows lost.
    pub(super) fn on_probe_answer(&mut self, now: Instant, peer: u32, token: SeqNum) {
        let ack_delay = self.config.ack_delay;
        let p = &mut self.peers[peer as usize];
        // Tokens count in units of about a millisecond: a late answer to an
        // earlier probe within the same unit reads as this one's, which at
        // worst finds lost a datagram that only was late, and its resend is
        // undone as spurious.
        if p.probe_sent != Instant::ZERO && token == probe_token(p.probe_sent) {
            p.rack_delivered(now, p.probe_sent, 0);
            // The path works: what the answer finds lost goes again now,
            // and gets a full timeout from here, not what is left of the
            // one running since before the probe.
            if p.head != NIL && p.timers.is_set(Timer::Rto) {
                p.timers.set(Timer::Rto, now + p.flight_timeout(ack_delay));
            }
        }
    }

    /// The retransmission timer expired (it is due at `now`). Data in
    /// flight: the timer backs off, the congestion window drops to one
    /// datagram and the oldest datagram not known delivered goes again.
    /// Only backlog (the credit lets nothing fly): a zero-window probe goes,
    /// with the same backoff. Nothing waiting: the timer stops. After
    /// [`resume`](crate::Reliability::resume) neither backs off.
    pub(super) fn on_rto(&mut self, now: Instant, peer: u32) {
        let rto_max = self.config.rto_max;
        let p = &mut self.peers[peer as usize];
        // After `resume` the timer refreshes the state without backing off:
        // the caller not running is no evidence against the path.
        let resumed = core::mem::take(&mut p.resumed);
        if p.head == NIL {
            if p.backlog_head == NIL {
                p.timers.stop(Timer::Rto);
            } else {
                // Data waits but the peer's credit lets nothing fly: ask
                // it for an acknowledgement, which carries its credit.
                self.stats.probes += 1;
                if !resumed {
                    p.rtt.back_off(rto_max);
                }
                p.timers.set(Timer::Rto, now + p.rtt.rto());
                self.queue_probe(peer);
            }
            return;
        }
        if !resumed {
            self.stats.timeouts += 1;
            p.rtt.back_off(rto_max);
            p.note_undo();
            p.ssthresh = (p.cwnd / 2).max(2 * CWND_UNIT);
            p.cwnd = CWND_UNIT;
        }
        p.timers.set(Timer::Rto, now + p.rtt.rto());
        if self.config.strict_liveness {
            // A probe too: a peer that refuses the resend for want of room
            // answers it with nothing new, but answers the probe (its
            // echo), and so shows it is alive.
            self.queue_probe(peer);
        }
        let p = &mut self.peers[peer as usize];
        // The congestion window is one datagram now: resend the oldest not
        // known delivered, asking for an acknowledgement. Its answer tells
        // RACK what else is missing (what was sent before it and is still
        // not delivered a round trip later), so a spurious timeout (a
        // receiver descheduled for a while) costs one datagram, and a real
        // one repairs the rest as the window reopens (`send_repairs`).
        let mut at = p.head;
        while at != NIL {
            let slot = &mut self.slots[at as usize];
            if slot.flags & (SACKED | QUEUED) == 0 {
                if slot.flags & LOST != 0 {
                    slot.flags &= !LOST;
                    p.lost -= 1;
                }
                slot.flags |= QUEUED;
                self.transmits.push_back(Pending::Data(at));
                break;
            }
            at = slot.next;
        }
    }
}
