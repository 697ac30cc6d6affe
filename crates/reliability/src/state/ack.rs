//! Acknowledgements: building the ACK/SACK part of every header sent, and
//! processing the one of every header received (releasing fragments, RTT
//! samples, congestion window growth).

use std::time::Duration;

use udbtl_wire::rel;

use super::peer::{CWND_UNIT, LOST, NIL, RELEASED, RESENT_AGAIN, RETRANSMITTED, SACKED, SENT};
use super::timer_table::Timer;
use super::types::{Event, PeerId};
use super::{Pending, Reliability};
use crate::config::SACK_SPAN;
use crate::time::Instant;

/// The smaller of two RTT samples. A datagram acknowledged late, because
/// the acknowledgement that first covered it was lost, overstates the RTT;
/// the newest datagram an acknowledgement covers gives the truest sample.
fn min_sample(current: Option<Duration>, sample: Duration) -> Option<Duration> {
    Some(current.map_or(sample, |c| c.min(sample)))
}

impl<F: Clone, R> Reliability<F, R> {
    /// A header acknowledging what the peer sent; clears what was owed.
    pub(super) fn ack_header(&mut self, peer: u32) -> rel::Repr {
        let credit = self.credit_for(peer);
        let p = &mut self.peers[peer as usize];
        p.rcv.ack_pending = 0;
        p.timers.stop(Timer::Ack);
        p.rcv.ack_now = false;
        rel::Repr {
            ack: p.rcv.nxt,
            sack: p.rcv.sack,
            credit,
            ..rel::Repr::default()
        }
    }

    pub(super) fn queue_ack(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        p.rcv.ack_now = true;
        if !p.rcv.ack_queued {
            p.rcv.ack_queued = true;
            // Ahead of the data queued to every peer: a peer whose data
            // arrived must not wait for the acknowledgement behind a
            // window's worth of datagrams to others (its retransmission
            // timer would expire meanwhile).
            self.transmits.push_front(Pending::Ack(peer));
        }
    }

    /// Processes the acknowledgement part of a header from `peer`.
    pub(super) fn on_ack(&mut self, now: Instant, peer: u32, header: &rel::Repr) {
        let config = &self.config;
        let p = &mut self.peers[peer as usize];
        if header.ack.is_after(p.snd_nxt) {
            // Acknowledges what was never sent: a corrupt or stale header.
            return;
        }
        p.peer_credit = header.credit.min(config.window);
        // Nothing in flight while data waits: the timer runs for probes.
        let probing = p.head == NIL && p.backlog_head != NIL;
        let mut newly_acked = 0u32;
        let mut newly_sacked = 0u32;
        let mut spurious = 0u64;
        // The longest a first transmission took to be acknowledged, among
        // those resent once, for nothing.
        let mut first_delay = Duration::ZERO;
        let mut rtt_sample = None;
        // The acknowledgement covers a retransmission, so it may answer that
        // (a timeout's or a probe's resend asks for one at once): the first
        // transmissions it also covers may have been delivered long before,
        // their own acknowledgements lost, and would make the round trip
        // look as long as the timeout. Karn's rule for the whole
        // acknowledgement: no sample from it.
        let mut repair_acked = false;
        // Cumulative part: release everything before `ack`.
        while p.head != NIL && self.slots[p.head as usize].seq.is_before(header.ack) {
            let index = p.head;
            let slot = &self.slots[index as usize];
            p.head = slot.next;
            if p.head == NIL {
                p.tail = NIL;
            }
            p.in_flight -= 1;
            newly_acked += 1;
            if slot.flags & SACKED != 0 {
                p.sacked -= 1;
            }
            if slot.flags & LOST != 0 {
                p.lost -= 1;
            }
            if slot.flags & (RETRANSMITTED | SACKED) == 0 && slot.flags & SENT != 0 {
                rtt_sample = min_sample(rtt_sample, now - slot.sent_at);
            }
            if slot.flags & (RETRANSMITTED | SACKED) == RETRANSMITTED {
                repair_acked = true;
            }
            if slot.flags & (SACKED | SENT) == SENT
                && p.rack_delivered(now, slot.sent_at, slot.flags)
            {
                spurious += 1;
                if slot.flags & RESENT_AGAIN == 0 {
                    first_delay = first_delay.max(now.saturating_since(slot.first_sent));
                }
            }
            if slot.flags & RELEASED == 0 {
                self.events.push_back(Event::Acked {
                    peer: PeerId(peer),
                    frag: slot.frag.clone(),
                });
            }
            self.free_slots.push(index);
        }
        if header.ack.is_after(p.snd_una) {
            p.snd_una = header.ack;
        }
        // Selective part: release early. Only the selective ACK's span can
        // be marked, so the walk stops there, whatever the window.
        let mut at = p.head;
        while at != NIL {
            let slot = &mut self.slots[at as usize];
            let offset = slot.seq - header.ack;
            if offset > SACK_SPAN {
                break;
            }
            if offset > 0 && header.sack & (1u64 << (offset - 1)) != 0 && slot.flags & SACKED == 0 {
                p.sacked += 1;
                slot.flags |= SACKED;
                if slot.flags & LOST != 0 {
                    // Delivered after all: nothing to repair.
                    slot.flags &= !LOST;
                    p.lost -= 1;
                }
                newly_sacked += 1;
                if slot.flags & RETRANSMITTED == 0 {
                    rtt_sample = min_sample(rtt_sample, now - slot.sent_at);
                } else {
                    repair_acked = true;
                }
                if slot.flags & SENT != 0 && p.rack_delivered(now, slot.sent_at, slot.flags) {
                    spurious += 1;
                    if slot.flags & RESENT_AGAIN == 0 {
                        first_delay = first_delay.max(now.saturating_since(slot.first_sent));
                    }
                }
                if slot.flags & RELEASED == 0 {
                    slot.flags |= RELEASED;
                    self.events.push_back(Event::Acked {
                        peer: PeerId(peer),
                        frag: slot.frag.clone(),
                    });
                }
            }
            at = slot.next;
        }
        self.stats.spurious_retransmits += spurious;
        p.settle_undo(header.ack, spurious);
        if !first_delay.is_zero() {
            // The path (or a descheduled receiver) took that long: the
            // timeout must cover it, or it fires for nothing again (RFC
            // 4015). Karn's rule had kept every such delay out of the
            // estimate, since it always ended in a resend.
            p.rtt.cover(first_delay, config.rto_min, config.rto_max);
        }
        if let Some(sample) = rtt_sample.filter(|_| !repair_acked) {
            p.rtt.sample(sample, config.rto_min, config.rto_max);
            let ns = u32::try_from(sample.as_nanos()).unwrap_or(u32::MAX);
            p.min_rtt_ns = p.min_rtt_ns.min(ns.max(1));
        }
        self.credit.acknowledged(newly_acked as usize);
        if newly_acked > 0 {
            p.rtt.end_backoff();
            p.resumed = false;
            // The timer covers datagrams that left: one sequenced but still
            // queued behind other peers' arms it when it is handed out
            // (`poll_transmit`), or it would expire while the datagram
            // waits here.
            if p.head == NIL || self.slots[p.head as usize].flags & SENT == 0 {
                p.timers.stop(Timer::Rto);
            } else {
                p.timers
                    .set(Timer::Rto, now + p.flight_timeout(config.ack_delay));
            }
            // Additive increase: a datagram per acknowledged datagram in slow
            // start, a datagram per window afterwards.
            let grow = if p.cwnd < p.ssthresh {
                newly_acked * CWND_UNIT
            } else {
                newly_acked * CWND_UNIT * CWND_UNIT / p.cwnd.max(1)
            };
            p.cwnd = (p.cwnd + grow).min(u32::from(config.window) * CWND_UNIT);
        }
        if newly_acked + newly_sacked > 0 {
            // News from the peer: it is alive.
            p.last_heard = now;
            // Something new arrived: the path works, so the retransmission
            // timer starts again, without backoff (a hole under repair does
            // not make it expire while later datagrams keep arriving, and a
            // lossy path does not keep it at its maximum), and a new probe
            // may go.
            p.rtt.end_backoff();
            p.probed = false;
            if newly_acked == 0 {
                p.timers
                    .set(Timer::Rto, now + p.flight_timeout(config.ack_delay));
            }
        }
        if probing && p.can_send(config) {
            // The window reopened: the probes' backoff says nothing about
            // the path, and the data about to go out gets a fresh timer.
            p.rtt.end_backoff();
            p.resumed = false;
            p.timers.stop(Timer::Rto);
        }
        if header.has(rel::FLAG_ECHO) {
            self.on_probe_answer(now, peer, header.seq);
        }
        self.detect_losses(now, peer);
        self.fill_window(now, peer);
        self.arm_probe(now, peer);
    }
}
