//! The sending side: queueing fragments, the backlog, moving it into the
//! send window as congestion window and credit allow, and handing out
//! datagrams (first transmissions and retransmissions) with their headers.

use udbtl_wire::SeqNum;
use udbtl_wire::datagram::Epochs;
use udbtl_wire::rel::{FLAG_ACK_ONLY, FLAG_ACK_REQ, FLAG_ECHO, FLAG_RESET};

use super::peer::{AWAITED, NIL, QUEUED, RESENT_AGAIN, RETRANSMITTED, SENT, Slot};
use super::recv::probe_token;
use super::timer_table::Timer;
use super::types::Mode;
use super::types::{PeerId, SendError, Transmit};
use super::{Pending, Reliability};
use crate::time::Instant;

impl<F: Clone, R> Reliability<F, R> {
    /// Queues a fragment for a peer. It is sequenced at once if the window
    /// allows, else when acknowledgements open it; either way it is
    /// retransmitted until acknowledged, and reported by an
    /// [`Event::Acked`](crate::Event::Acked) or, if the peer is lost, an [`Event::Failed`](crate::Event::Failed).
    ///
    /// # Errors
    /// An unknown, lost or closed peer; the fragment stays the caller's.
    pub fn send(&mut self, now: Instant, peer: PeerId, frag: F) -> Result<(), SendError> {
        self.queue(now, peer, frag, 0)
    }

    /// As [`send`](Self::send), for a fragment whose sender waits for its
    /// acknowledgement (its memory is released only then): every
    /// transmission asks the peer to acknowledge at once, instead of after
    /// [`Config::ack_every`](crate::Config::ack_every) datagrams or [`Config::ack_delay`](crate::Config::ack_delay).
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn send_awaited(&mut self, now: Instant, peer: PeerId, frag: F) -> Result<(), SendError> {
        self.queue(now, peer, frag, AWAITED)
    }

    /// Whether [`send`](Self::send) to `peer` would accept a fragment now,
    /// and if not, the error it would return.
    ///
    /// # Errors
    /// An unknown, lost or closed peer.
    pub fn accepts(&self, peer: PeerId) -> Result<(), SendError> {
        let mode = self
            .view(peer, |p| p.mode)
            .ok_or(SendError::NoPeer(peer.0))?;
        match mode {
            Mode::Active => Ok(()),
            Mode::Lost(_) => Err(SendError::PeerLost(peer.0)),
            Mode::Lingering(_) => Err(SendError::Closed(peer.0)),
        }
    }

    pub(super) fn queue(
        &mut self,
        now: Instant,
        peer: PeerId,
        frag: F,
        flags: u8,
    ) -> Result<(), SendError> {
        self.accepts(peer)?;
        self.wake(now, peer.0);
        let slot = self.alloc_slot(Slot {
            frag,
            peer: peer.0,
            seq: SeqNum(0),
            sent_at: now,
            first_sent: now,
            next: NIL,
            flags,
        });
        let p = &mut self.peers[peer.0 as usize];
        if p.head == NIL && p.backlog_head == NIL {
            // The peer owes us nothing until now: the failure clock starts.
            p.last_heard = now;
        }
        Self::append(
            &mut self.slots,
            &mut p.backlog_head,
            &mut p.backlog_tail,
            slot,
        );
        p.backlog_len += 1;
        self.fill_window(now, peer.0);
        self.reschedule(peer.0);
        Ok(())
    }

    pub(super) fn alloc_slot(&mut self, slot: Slot<F>) -> u32 {
        match self.free_slots.pop() {
            Some(index) => {
                self.slots[index as usize] = slot;
                index
            }
            None => {
                self.slots.push(slot);
                self.reserve_transmits();
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub(super) fn append(slots: &mut [Slot<F>], head: &mut u32, tail: &mut u32, index: u32) {
        slots[index as usize].next = NIL;
        if *tail == NIL {
            *head = index;
        } else {
            slots[*tail as usize].next = index;
        }
        *tail = index;
    }

    /// Moves backlog into flight while the window allows. Backlog left with
    /// no timer running (nothing in flight: the credit allows nothing) arms
    /// the retransmission timer, whose expiry sends a zero-window probe.
    pub(super) fn fill_window(&mut self, now: Instant, peer: u32) {
        loop {
            let p = &mut self.peers[peer as usize];
            if p.backlog_head == NIL {
                return;
            }
            if !p.can_send(&self.config) {
                // With datagrams in flight, the timer runs from when they
                // leave (`poll_transmit` arms it).
                if p.head == NIL && !p.timers.is_set(Timer::Rto) {
                    p.timers.set(Timer::Rto, now + p.rtt.rto());
                }
                return;
            }
            let index = p.backlog_head;
            p.backlog_head = self.slots[index as usize].next;
            p.backlog_len -= 1;
            if p.backlog_head == NIL {
                p.backlog_tail = NIL;
            }
            let seq = p.snd_nxt;
            p.snd_nxt = seq.next();
            if p.snd_nxt.0 == 0 {
                p.snd_epoch = p.snd_epoch.wrapping_add(1);
            }
            p.in_flight += 1;
            self.credit.sent();
            p.last_data = Some(now);
            Self::append(&mut self.slots, &mut p.head, &mut p.tail, index);
            let slot = &mut self.slots[index as usize];
            slot.seq = seq;
            slot.flags |= QUEUED;
            self.transmits.push_back(Pending::Data(index));
        }
    }

    /// The next datagram to send, with its header and the epochs a seal
    /// covers. Acknowledgements owed to the peer ride on it.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit<F>> {
        let mut transmit = self.next_transmit(now)?;
        transmit.epochs = self.peers[transmit.peer.0 as usize].epochs_to_send(&transmit.header);
        Some(transmit)
    }

    fn next_transmit(&mut self, now: Instant) -> Option<Transmit<F>> {
        while let Some(pending) = self.transmits.pop_front() {
            match pending {
                Pending::Data(index) => {
                    let slot = &mut self.slots[index as usize];
                    if slot.flags & QUEUED == 0 {
                        continue;
                    }
                    slot.flags &= !QUEUED;
                    let awaited = slot.flags & AWAITED != 0;
                    let retransmission = slot.flags & SENT != 0;
                    // Until its first transmission, `first_sent` holds when
                    // it was queued: earlier than now, it waited for the
                    // window.
                    let waited = !retransmission && slot.first_sent < now;
                    if slot.flags & RETRANSMITTED != 0 {
                        slot.flags |= RESENT_AGAIN;
                    }
                    slot.flags |= SENT | if retransmission { RETRANSMITTED } else { 0 };
                    slot.sent_at = now;
                    if !retransmission {
                        slot.first_sent = now;
                    }
                    let (peer, seq, frag) = (slot.peer, slot.seq, slot.frag.clone());
                    if retransmission {
                        self.stats.retransmitted += 1;
                    } else {
                        self.stats.sent += 1;
                    }
                    let p = &mut self.peers[peer as usize];
                    if !p.timers.is_set(Timer::Rto) {
                        let rto = p.flight_timeout(self.config.ack_delay);
                        p.timers.set(Timer::Rto, now + rto);
                    }
                    if !p.probed {
                        let pto = p.probe_timeout(self.config.ack_delay);
                        p.timers.set(Timer::Pto, now + pto);
                    }
                    let p = &self.peers[peer as usize];
                    // A full window of fewer than two acknowledgements'
                    // worth: without asking, it would stall for `ack_delay`.
                    // A larger one hears an acknowledgement every
                    // `ack_every` datagrams anyway, and asking on each would
                    // draw one acknowledgement per datagram, each taking a
                    // receive buffer here.
                    let window_full = !p.can_send(&self.config)
                        && u32::from(p.in_flight) < 2 * u32::from(self.config.ack_every);
                    // The newest datagram of a flight of several, or one
                    // that waited for the window, with nothing waiting
                    // behind it: the end of a burst. (A lone datagram sent
                    // as it is queued is a request, whose reply carries the
                    // acknowledgement.)
                    let burst_end =
                        p.tail == index && p.backlog_head == NIL && (p.in_flight > 1 || waited);
                    let mut header = self.ack_header(peer);
                    header.seq = seq;
                    if retransmission || window_full || awaited || burst_end {
                        // Ask for an acknowledgement at once: the sender is
                        // waiting, to repair a loss or for window to send
                        // more, or a burst ends, whose last datagrams the
                        // receiver would otherwise acknowledge only after
                        // `ack_delay`, long after the tail-loss probe is due.
                        header.flags |= FLAG_ACK_REQ;
                    }
                    self.reschedule(peer);
                    return Some(Transmit {
                        peer: PeerId(peer),
                        frag: Some(frag),
                        header,
                        retransmission,
                        epochs: Epochs::default(),
                    });
                }
                Pending::Ack(peer) => {
                    let p = &mut self.peers[peer as usize];
                    if (p.rcv.ack_pending == 0 && !p.rcv.ack_now) || p.mode.is_lost() {
                        // A data datagram carried it already, or the peer
                        // is gone.
                        p.rcv.ack_queued = false;
                        continue;
                    }
                    if self.acks_held {
                        // Still queued: it goes when released, unless a
                        // reply carries it first.
                        if !p.timers.is_set(Timer::Ack) {
                            p.timers.set(Timer::Ack, now + self.config.ack_delay);
                        }
                        self.held_acks.push(peer);
                        self.reschedule(peer);
                        continue;
                    }
                    p.rcv.ack_queued = false;
                    self.stats.acks_sent += 1;
                    return Some(self.control_transmit(peer, FLAG_ACK_ONLY));
                }
                Pending::Probe(peer) => {
                    let p = &mut self.peers[peer as usize];
                    p.probe_queued = false;
                    if p.mode.is_lost() {
                        continue;
                    }
                    p.probe_sent = now;
                    // Its answer echoes the token: when it was sent.
                    let mut probe = self.control_transmit(peer, FLAG_ACK_ONLY | FLAG_ACK_REQ);
                    probe.header.seq = probe_token(now);
                    return Some(probe);
                }
                Pending::Reset(peer) => {
                    self.stats.resets_sent += 1;
                    let mut reset = self.control_transmit(peer, FLAG_ACK_ONLY | FLAG_RESET);
                    if let Mode::Lost(seq) = self.peers[peer as usize].mode {
                        reset.header.seq = seq;
                    }
                    return Some(reset);
                }
            }
        }
        None
    }

    /// Holds acknowledgement-only datagrams back until
    /// [`release_acks`](Self::release_acks): the caller was just handed data
    /// and is likely to reply before its next call, and the reply carries
    /// the acknowledgement, which then costs no datagram of its own (an
    /// acknowledgement asked for at once included). Data, probes and resets
    /// still go. A held acknowledgement keeps its peer's acknowledgement
    /// timer armed (`ack_delay`), so that a caller that sleeps until
    /// [`poll_timeout`](Self::poll_timeout) wakes in time to release it.
    pub fn hold_acks(&mut self) {
        self.acks_held = true;
    }

    /// Ends [`hold_acks`](Self::hold_acks): the held acknowledgements are
    /// queued again, ahead of data, for the next
    /// [`poll_transmit`](Self::poll_transmit),
    /// which skips those a data datagram carried meanwhile. Returns whether
    /// any was held.
    pub fn release_acks(&mut self) -> bool {
        self.acks_held = false;
        let held = !self.held_acks.is_empty();
        for peer in self.held_acks.drain(..) {
            // Ahead of data, as `queue_ack` puts them.
            self.transmits.push_front(Pending::Ack(peer));
        }
        held
    }

    /// Queues a probe to `peer`: an acknowledgement-only datagram that asks
    /// for one back at once, and whose answer echoes its token. One waiting
    /// in the queue is enough.
    pub(super) fn queue_probe(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        if !core::mem::replace(&mut p.probe_queued, true) {
            self.transmits.push_back(Pending::Probe(peer));
        }
    }

    /// A datagram without data: an acknowledgement with `flags`. A plain
    /// one answers the peer's last probe, if it is owed, by echoing its
    /// token (`FLAG_ECHO`).
    pub(super) fn control_transmit(&mut self, peer: u32, flags: u16) -> Transmit<F> {
        let mut header = self.ack_header(peer);
        header.flags |= flags;
        let p = &mut self.peers[peer as usize];
        header.seq = p.snd_nxt;
        if flags == FLAG_ACK_ONLY && core::mem::take(&mut p.rcv.echo_owed) {
            header.seq = p.rcv.echo;
            header.flags |= FLAG_ECHO;
        }
        self.reschedule(peer);
        Transmit {
            peer: PeerId(peer),
            frag: None,
            header,
            retransmission: false,
            epochs: Epochs::default(),
        }
    }
}
