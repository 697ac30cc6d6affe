//! One peer's protocol state ([`Peer`]) and the shared slot table's entries
//! ([`Slot`]): the datagrams of every peer's stream, in flight or waiting
//! for the window, threaded into per-peer lists.

use udbtl_wire::SeqNum;
use udbtl_wire::datagram::Epochs;
use udbtl_wire::rel::{self, FLAG_ACK_ONLY, FLAG_ACK_REQ, FLAG_ECHO, FLAG_RESET};

use super::recv::RecvState;
use super::timer_table::{Timer, TimerTable, earliest};
use super::types::{Mode, StreamStart};
use crate::config::Config;
use crate::rtt::Rtt;
use crate::time::Instant;

/// "No entry" in the intrusive lists threaded through the slot table.
pub(super) const NIL: u32 = u32::MAX;

/// Slot flags.
pub(super) const SACKED: u8 = 0x1;
pub(super) const SENT: u8 = 0x2;
pub(super) const RETRANSMITTED: u8 = 0x4;
pub(super) const QUEUED: u8 = 0x8;
/// The caller has been told the fragment is done (acknowledged or failed).
pub(super) const RELEASED: u8 = 0x10;
/// The sender waits for this datagram's acknowledgement: every transmission
/// asks for it at once.
pub(super) const AWAITED: u8 = 0x20;
/// Found lost, and waiting for room in the congestion window to be sent
/// again.
pub(super) const LOST: u8 = 0x40;
/// Sent three times or more: an acknowledgement that follows a resend too
/// closely to answer it says nothing of how long the first transmission
/// took (it may answer the one before), unlike one of a datagram resent
/// once.
pub(super) const RESENT_AGAIN: u8 = 0x80;

/// One datagram of one peer's stream: in flight, or waiting for the window.
#[derive(Debug, Clone)]
pub(super) struct Slot<F> {
    pub(super) frag: F,
    pub(super) peer: u32,
    pub(super) seq: SeqNum,
    /// When it was last sent.
    pub(super) sent_at: Instant,
    /// When it was first sent (until then, when it was queued): a resend
    /// found spurious measures the delay the first transmission met (Eifel
    /// response, RFC 4015).
    pub(super) first_sent: Instant,
    pub(super) next: u32,
    pub(super) flags: u8,
}

impl Peer {
    /// Notes the congestion window before a loss response, unless one is
    /// already under way (the first window is the one to restore).
    pub(super) fn note_undo(&mut self) {
        if self.undo_cwnd == 0 {
            self.undo_cwnd = self.cwnd.max(1);
            self.undo_until = self.snd_nxt;
        }
    }

    /// An acknowledgement up to `ack` came in, showing `spurious` resends
    /// were not needed. A spurious one restores the window the loss
    /// response replaced, and continues from it in congestion avoidance;
    /// one that covers everything sent before the response, with no such
    /// sign, makes the response stand.
    pub(super) fn settle_undo(&mut self, ack: SeqNum, spurious: u64) {
        if self.undo_cwnd == 0 {
            return;
        }
        if spurious > 0 {
            self.cwnd = self.cwnd.max(self.undo_cwnd);
            self.ssthresh = self.cwnd;
            self.undo_cwnd = 0;
        } else if !ack.is_before(self.undo_until) {
            self.undo_cwnd = 0;
        }
    }
}

/// The state of one peer. Its size does not depend on traffic: datagrams in
/// flight live in the state's shared slot table, linked from here.
#[derive(Debug, Clone)]
pub(super) struct Peer {
    pub(super) mode: Mode,
    // ----- sending
    /// Oldest sequence number not cumulatively acknowledged.
    pub(super) snd_una: SeqNum,
    /// Next sequence number to assign.
    pub(super) snd_nxt: SeqNum,
    /// How often `snd_nxt` wrapped: the high half of its 64-bit stream
    /// position, which a seal covers (`datagram::Epochs`).
    pub(super) snd_epoch: u32,
    /// How often `rcv.nxt` wrapped.
    pub(super) rcv_epoch: u32,
    /// In-flight list (sequenced), oldest first.
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) in_flight: u16,
    /// Backlog (not yet sequenced: the window was full), oldest first.
    pub(super) backlog_head: u32,
    pub(super) backlog_tail: u32,
    /// Fragments in the backlog.
    pub(super) backlog_len: u32,
    /// Congestion window, in 1/1024 datagrams (so additive increase needs
    /// no floating point).
    pub(super) cwnd: u32,
    pub(super) ssthresh: u32,
    /// The congestion window before the loss response under way (a
    /// timeout, or losses found; 0: none), restored if an acknowledgement
    /// shows a resend was spurious (Eifel, RFC 3522): a descheduled
    /// receiver is not a congested path. The response stands once
    /// everything sent before `undo_until` is acknowledged without such a
    /// sign.
    pub(super) undo_cwnd: u32,
    pub(super) undo_until: SeqNum,
    /// Datagrams past `snd_una` the peer last said it accepts.
    pub(super) peer_credit: u16,
    pub(super) rtt: Rtt,
    /// Time-based loss detection (RACK, RFC 8985): when the newest
    /// datagram known delivered was sent, and its round trip. A datagram
    /// sent before it and not delivered a round trip plus the reordering
    /// window after its own send is lost, however often it was sent.
    pub(super) rack_sent: Instant,
    pub(super) rack_rtt_ns: u32,
    /// The smallest round trip measured: a quarter of it is the reordering
    /// window.
    pub(super) min_rtt_ns: u32,
    /// Datagrams in flight selectively acknowledged.
    pub(super) sacked: u16,
    /// Datagrams in flight found lost and not sent again yet (`LOST`).
    pub(super) lost: u16,
    /// A tail-loss probe went and nothing new was acknowledged since: the
    /// retransmission timer decides next.
    pub(super) probed: bool,
    /// A probe (an acknowledgement request) waits in the transmit queue:
    /// another one would say nothing more.
    pub(super) probe_queued: bool,
    /// When the last probe left (`Instant::ZERO`: none yet). The answer
    /// that echoes its token shows what the peer had received by then,
    /// which RACK takes as a datagram delivered that was sent at this time.
    pub(super) probe_sent: Instant,
    /// Last time a valid datagram from the peer was handled, or when it
    /// was first owed an acknowledgement, or the last
    /// [`Reliability::resume`](crate::Reliability::resume): the failure clock.
    pub(super) last_heard: Instant,
    /// Last time data was sequenced for the peer or arrived from it; starts
    /// the keepalive watch (see [`Config::keepalive`](crate::Config::keepalive)).
    pub(super) last_data: Option<Instant>,
    /// Last keepalive probe sent (`Instant::ZERO`: none yet).
    pub(super) last_keepalive: Instant,
    /// [`CREDIT_ACTIVE`] and [`CREDIT_STARVED`].
    pub(super) credit_flags: u8,
    /// The retransmission timer was set by [`Reliability::resume`](crate::Reliability::resume): its
    /// expiry refreshes the peer's state without backing off.
    pub(super) resumed: bool,
    /// The receiving side: window, early datagrams, acknowledgement owed.
    pub(super) rcv: RecvState,
    // ----- timers
    /// The deadlines armed and stopped explicitly: retransmission, loss,
    /// tail-loss probe and delayed acknowledgement.
    pub(super) timers: TimerTable,
    /// Deadline of this peer's live entry in the timer heap.
    pub(super) scheduled: Option<Instant>,
}

pub(super) const CWND_UNIT: u32 = 1024;

/// `Peer::credit_flags`: the peer sent data within the credit horizon.
pub(super) const CREDIT_ACTIVE: u8 = 1;
/// `Peer::credit_flags`: the peer was told a credit of 0.
pub(super) const CREDIT_STARVED: u8 = 2;

impl Peer {
    pub(super) fn new(config: &Config, now: Instant, start: StreamStart) -> Self {
        Self {
            mode: Mode::Active,
            snd_una: start.send,
            snd_nxt: start.send,
            head: NIL,
            tail: NIL,
            in_flight: 0,
            backlog_head: NIL,
            backlog_tail: NIL,
            backlog_len: 0,
            cwnd: u32::from(config.initial_cwnd) * CWND_UNIT,
            ssthresh: u32::MAX,
            undo_cwnd: 0,
            undo_until: start.send,
            peer_credit: config.initial_credit,
            rtt: Rtt::new(config.rto_initial),
            rack_sent: Instant::ZERO,
            rack_rtt_ns: 0,
            min_rtt_ns: u32::MAX,
            sacked: 0,
            lost: 0,
            probed: false,
            probe_queued: false,
            probe_sent: Instant::ZERO,
            last_heard: now,
            last_data: None,
            last_keepalive: Instant::ZERO,
            credit_flags: 0,
            snd_epoch: 0,
            rcv_epoch: 0,
            resumed: false,
            rcv: RecvState::new(start.recv),
            timers: TimerTable::new(),
            scheduled: None,
        }
    }

    pub(super) fn window(&self, config: &Config) -> u32 {
        (self.cwnd / CWND_UNIT).clamp(1, u32::from(config.window))
    }

    /// A new datagram may be sequenced: congestion window and peer credit.
    pub(super) fn can_send(&self, config: &Config) -> bool {
        u32::from(self.in_flight) < self.window(config)
            && (self.snd_nxt - self.snd_una) < i32::from(self.peer_credit)
    }

    /// Whether the congestion window has room for one more datagram in the
    /// network: the pipe (RFC 6675), the datagrams in flight neither
    /// selectively acknowledged nor found lost, is below it.
    pub(super) fn pipe_has_room(&self) -> bool {
        let pipe = u32::from(self.in_flight)
            .saturating_sub(u32::from(self.sacked))
            .saturating_sub(u32::from(self.lost));
        pipe * CWND_UNIT < self.cwnd.max(CWND_UNIT)
    }

    /// The next sequence number expected from the peer moves on by one.
    pub(super) fn advance_rcv(&mut self) {
        self.rcv.nxt = self.rcv.nxt.next();
        if self.rcv.nxt.0 == 0 {
            self.rcv_epoch = self.rcv_epoch.wrapping_add(1);
        }
    }

    /// The epochs this side seals a datagram to the peer with: `header`'s
    /// `seq` in this side's send stream (a probe's token and its echo have
    /// epoch 0), its `ack` in the peer's.
    pub(super) fn epochs_to_send(&self, header: &rel::Repr) -> Epochs {
        Epochs {
            seq: if is_token(header) {
                0
            } else {
                header.seq.epoch_near(self.snd_nxt, self.snd_epoch)
            },
            ack: header.ack.epoch_near(self.rcv.nxt, self.rcv_epoch),
        }
    }

    /// The epochs a datagram from the peer with `header` was sealed with,
    /// as [`epochs_to_send`](Self::epochs_to_send) computed them there.
    pub(super) fn epochs_received(&self, header: &rel::Repr) -> Epochs {
        Epochs {
            seq: if is_token(header) {
                0
            } else {
                header.seq.epoch_near(self.rcv.nxt, self.rcv_epoch)
            },
            ack: header.ack.epoch_near(self.snd_nxt, self.snd_epoch),
        }
    }

    /// Nothing is in flight or waiting for the peer.
    pub(super) fn idle(&self) -> bool {
        self.head == NIL && self.backlog_head == NIL
    }
}

impl Peer {
    /// The earliest timer. The failure deadline only counts when no
    /// retransmission timer runs: while one does, its expiries check for
    /// failure, which keeps the timer heap from gaining an entry per send.
    pub(super) fn next_deadline(&self, config: &Config) -> Option<Instant> {
        let mut next = self.timers.next_timeout();
        if !self.timers.is_set(Timer::Rto) {
            next = earliest(next, self.fail_at(config));
            next = earliest(next, self.keepalive_at(config));
        }
        if let Mode::Lingering(until) = self.mode {
            next = earliest(next, Some(until));
        }
        next
    }
}

/// Whether `header`'s `seq` is a probe's time token or its echo, not a
/// stream position.
fn is_token(header: &rel::Repr) -> bool {
    header.has(FLAG_ACK_ONLY)
        && !header.has(FLAG_RESET)
        && (header.has(FLAG_ACK_REQ) || header.has(FLAG_ECHO))
}
