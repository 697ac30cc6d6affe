//! The protocol state of every peer of one endpoint.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use udbtl_wire::SeqNum;
use udbtl_wire::rel::{self, FLAG_ACK_ONLY, FLAG_ACK_REQ, FLAG_RESET};

use crate::config::{Config, ConfigError, SACK_SPAN};
use crate::rtt::Rtt;
use crate::time::Instant;

/// A peer, as numbered by the caller (an index into its own peer table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// "No entry" in the intrusive lists threaded through the slot table.
const NIL: u32 = u32::MAX;

/// Slot flags.
const SACKED: u8 = 0x1;
const SENT: u8 = 0x2;
const RETRANSMITTED: u8 = 0x4;
const QUEUED: u8 = 0x8;
/// The caller has been told the fragment is done (acknowledged or failed).
const RELEASED: u8 = 0x10;
/// The sender waits for this datagram's acknowledgement: every transmission
/// asks for it at once.
const AWAITED: u8 = 0x20;

/// One datagram of one peer's stream: in flight, or waiting for the window.
#[derive(Debug, Clone)]
struct Slot<F> {
    frag: F,
    peer: u32,
    seq: SeqNum,
    sent_at: Instant,
    next: u32,
    flags: u8,
}

/// Where a peer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Active,
    /// Closed by the caller: no new sends; still acknowledges until then.
    Lingering(Instant),
    /// Declared lost (nothing heard for `peer_timeout` while data waited,
    /// or the peer sent a reset), or finished lingering.
    Lost,
}

/// The state of one peer. Its size does not depend on traffic: datagrams in
/// flight live in the endpoint's shared slot table, linked from here.
#[derive(Debug, Clone)]
struct Peer {
    mode: Mode,
    // ----- sending
    /// Oldest sequence number not cumulatively acknowledged.
    snd_una: SeqNum,
    /// Next sequence number to assign.
    snd_nxt: SeqNum,
    /// In-flight list (sequenced), oldest first.
    head: u32,
    tail: u32,
    in_flight: u16,
    /// Backlog (not yet sequenced: the window was full), oldest first.
    backlog_head: u32,
    backlog_tail: u32,
    /// Congestion window, in 1/1024 datagrams (so additive increase needs
    /// no floating point).
    cwnd: u32,
    ssthresh: u32,
    /// Datagrams past `snd_una` the peer last said it accepts.
    peer_credit: u16,
    rtt: Rtt,
    rto_at: Option<Instant>,
    /// Time-based loss detection (RACK, RFC 8985): when the newest
    /// datagram known delivered was sent, and its round trip. A datagram
    /// sent before it and not delivered a round trip plus the reordering
    /// window after its own send is lost, however often it was sent.
    rack_sent: Instant,
    rack_rtt_ns: u32,
    /// The smallest round trip measured: a quarter of it is the reordering
    /// window.
    min_rtt_ns: u32,
    /// When the earliest datagram that RACK suspects becomes lost.
    loss_at: Option<Instant>,
    /// Datagrams in flight selectively acknowledged.
    sacked: u16,
    /// The tail-loss probe's deadline: with data in flight and nothing
    /// acknowledged for two round trips, the newest datagram goes again and
    /// asks for an acknowledgement, which lets RACK see a lost tail.
    pto_at: Option<Instant>,
    /// A tail-loss probe went and nothing new was acknowledged since: the
    /// retransmission timer decides next.
    probed: bool,
    /// Last time a valid datagram from the peer was handled, or when it
    /// was first owed an acknowledgement, or the last
    /// [`Reliability::resume`]: the failure clock.
    last_heard: Instant,
    /// Last time data was sequenced for the peer or arrived from it; starts
    /// the keepalive watch (see [`Config::keepalive`]).
    last_data: Option<Instant>,
    /// Last keepalive probe sent.
    last_keepalive: Option<Instant>,
    /// The retransmission timer was set by [`Reliability::resume`]: its
    /// expiry refreshes the peer's state without backing off.
    resumed: bool,
    // ----- receiving
    /// Next sequence number expected from the peer.
    rcv_nxt: SeqNum,
    /// Bit `i`: `rcv_nxt + 1 + i` arrived and is buffered.
    rcv_sack: u64,
    /// Datagrams received since the last acknowledgement went out.
    ack_pending: u16,
    ack_at: Option<Instant>,
    /// An acknowledgement must go out at the next transmit opportunity.
    ack_now: bool,
    ack_queued: bool,
    // ----- timers
    /// Deadline of this peer's live entry in the timer heap.
    scheduled: Option<Instant>,
}

const CWND_UNIT: u32 = 1024;

/// The shortest tail-loss probe timeout: below it, timer granularity and
/// scheduling noise would make most probes spurious.
const PTO_MIN: Duration = Duration::from_micros(10);

impl Peer {
    fn new(config: &Config, now: Instant) -> Self {
        Self {
            mode: Mode::Active,
            snd_una: config.initial_seq,
            snd_nxt: config.initial_seq,
            head: NIL,
            tail: NIL,
            in_flight: 0,
            backlog_head: NIL,
            backlog_tail: NIL,
            cwnd: u32::from(config.initial_cwnd) * CWND_UNIT,
            ssthresh: u32::MAX,
            peer_credit: config.initial_credit,
            rtt: Rtt::new(config.rto_initial),
            rto_at: None,
            rack_sent: Instant::ZERO,
            rack_rtt_ns: 0,
            min_rtt_ns: u32::MAX,
            loss_at: None,
            sacked: 0,
            pto_at: None,
            probed: false,
            last_heard: now,
            last_data: None,
            last_keepalive: None,
            resumed: false,
            rcv_nxt: config.initial_seq,
            rcv_sack: 0,
            ack_pending: 0,
            ack_at: None,
            ack_now: false,
            ack_queued: false,
            scheduled: None,
        }
    }

    /// Notes that a datagram sent at `sent_at` was delivered (acknowledged
    /// cumulatively or selectively) at `now`, for RACK. Returns `true` if it
    /// was a retransmission acknowledged sooner than any round trip: the
    /// acknowledgement was for the first transmission, so the
    /// retransmission was spurious, and it says nothing about when the
    /// newest delivered datagram was sent.
    fn rack_delivered(&mut self, now: Instant, sent_at: Instant, flags: u8) -> bool {
        let rtt = u32::try_from(now.saturating_since(sent_at).as_nanos()).unwrap_or(u32::MAX);
        if flags & RETRANSMITTED != 0 && rtt < self.min_rtt_ns {
            return true;
        }
        if sent_at >= self.rack_sent {
            self.rack_sent = sent_at;
            self.rack_rtt_ns = rtt.max(1);
        }
        false
    }

    /// Two smoothed round trips, at least [`PTO_MIN`]; the initial timeout
    /// before any sample.
    fn probe_timeout(&self) -> Duration {
        let srtt = self.rtt.srtt();
        if srtt.is_zero() {
            self.rtt.rto()
        } else {
            (2 * srtt).max(PTO_MIN)
        }
    }

    fn window(&self, config: &Config) -> u32 {
        (self.cwnd / CWND_UNIT).clamp(1, u32::from(config.window))
    }

    /// A new datagram may be sequenced: congestion window and peer credit.
    fn can_send(&self, config: &Config) -> bool {
        u32::from(self.in_flight) < self.window(config)
            && (self.snd_nxt - self.snd_una) < i32::from(self.peer_credit)
    }

    fn fail_at(&self, config: &Config) -> Option<Instant> {
        (!self.idle() || self.watched(config)).then(|| self.last_heard + config.peer_timeout)
    }

    /// Nothing is in flight or waiting for the peer.
    fn idle(&self) -> bool {
        self.head == NIL && self.backlog_head == NIL
    }

    /// Under the keepalive watch: data flowed, and the peer has not been
    /// heard from for a whole `peer_timeout` since.
    fn watched(&self, config: &Config) -> bool {
        config.keepalive
            && self.mode == Mode::Active
            && self
                .last_data
                .is_some_and(|data| self.last_heard < data + config.peer_timeout)
    }

    /// When the next keepalive probe is due: a quarter of `peer_timeout`
    /// after the peer was last heard from or probed, while idle and watched.
    fn keepalive_at(&self, config: &Config) -> Option<Instant> {
        (self.idle() && self.watched(config)).then(|| {
            let since = self
                .last_keepalive
                .map_or(self.last_heard, |probe| probe.max(self.last_heard));
            since + config.peer_timeout / 4
        })
    }

    /// The earliest timer. The failure deadline only counts when no
    /// retransmission timer runs: while one does, its expiries check for
    /// failure, which keeps the timer heap from gaining an entry per send.
    fn next_deadline(&self, config: &Config) -> Option<Instant> {
        let mut next = earliest(self.rto_at, self.ack_at);
        next = earliest(next, earliest(self.loss_at, self.pto_at));
        if self.rto_at.is_none() {
            next = earliest(next, self.fail_at(config));
            next = earliest(next, self.keepalive_at(config));
        }
        if let Mode::Lingering(until) = self.mode {
            next = earliest(next, Some(until));
        }
        next
    }
}

/// The earlier of two optional deadlines. Runs on every send and receive:
/// plain comparisons, no iterator.
const fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.as_nanos() < a.as_nanos() { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The smaller of two RTT samples. A datagram acknowledged late, because
/// the acknowledgement that first covered it was lost, overstates the RTT;
/// the newest datagram an acknowledgement covers gives the truest sample.
fn min_sample(current: Option<Duration>, sample: Duration) -> Option<Duration> {
    Some(current.map_or(sample, |c| c.min(sample)))
}

/// What to do with a received datagram's buffer.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum Receipt<R> {
    /// Next in order: deliver it now, then drain [`Reliability::poll_deliver`].
    Deliver(R),
    /// Arrived early: the endpoint keeps the buffer until its turn.
    Buffered,
    /// Not to be delivered (duplicate, outside the window, acknowledgement
    /// only, from a lost peer, or refused for want of [`Room`]): the caller
    /// reuses the buffer.
    Discard(R, Discard),
}

/// Why a datagram was discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discard {
    /// Carried only an acknowledgement.
    AckOnly,
    /// Already delivered or buffered.
    Duplicate,
    /// Beyond the advertised window, or too far ahead of a gap to buffer.
    OutOfWindow,
    /// The peer was declared lost.
    PeerLost,
    /// The caller had no [`Room`] for the datagram: its data was refused
    /// (not acknowledged), and the sender will retransmit it.
    NoRoom,
}

/// What the caller can take of a received data datagram, passed to
/// [`Reliability::on_datagram`]. A datagram that needs what is not allowed
/// is refused: its acknowledgement part is still processed, but it is not
/// acknowledged, so the sender retransmits it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The caller can take the next in-order datagram (deliver it or keep
    /// it).
    pub in_order: bool,
    /// The caller can keep one more buffer for a datagram that arrives
    /// before its turn ([`Receipt::Buffered`]).
    pub early: bool,
}

impl Room {
    /// Room for anything.
    pub const ALL: Self = Self {
        in_order: true,
        early: true,
    };
}

/// Why a peer was declared lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Nothing was heard from it for `peer_timeout` while data waited.
    Timeout,
    /// It sent a reset: it had declared this side lost, so every stream
    /// between the two is broken.
    Reset,
}

/// Something the caller must hear about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<F> {
    /// The peer has the fragment: the caller may release it.
    Acked {
        /// The peer.
        peer: PeerId,
        /// The fragment.
        frag: F,
    },
    /// The fragment will never be acknowledged: its peer was lost.
    Failed {
        /// The peer.
        peer: PeerId,
        /// The fragment.
        frag: F,
    },
    /// The peer was declared lost: nothing was heard from it for
    /// `peer_timeout` while data waited, or it reset the streams. Its
    /// fragments failed (each with an [`Event::Failed`] before this).
    PeerLost {
        /// The peer.
        peer: PeerId,
        /// Why.
        reason: LossReason,
    },
    /// A closed peer finished lingering; its id may be reused.
    PeerClosed {
        /// The peer.
        peer: PeerId,
    },
}

/// A datagram to put on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Transmit<F> {
    /// The destination.
    pub peer: PeerId,
    /// The fragment to send, or `None` for a datagram without data: an
    /// acknowledgement, a zero-window probe (with `FLAG_ACK_REQ`) or a
    /// reset (with [`rel::FLAG_RESET`]).
    pub frag: Option<F>,
    /// The reliability header to send with it (the caller fills in `src`
    /// and may add message and checksum flags).
    pub header: rel::Repr,
    /// `true` if this fragment was sent before.
    pub retransmission: bool,
}

/// Why a send was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// No such peer.
    #[error("no peer {0}")]
    NoPeer(u32),
    /// The peer was declared lost.
    #[error("peer {0} was declared lost")]
    PeerLost(u32),
    /// The peer was closed.
    #[error("peer {0} is closed")]
    Closed(u32),
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Data datagrams sent for the first time.
    pub sent: u64,
    /// Data datagrams sent again.
    pub retransmitted: u64,
    /// Retransmissions of datagrams found lost by time (RACK): sent before
    /// one that was delivered, and not delivered a round trip later.
    pub fast_retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Tail-loss probes sent: the newest datagram in flight again, after
    /// two round trips without an acknowledgement.
    pub tail_probes: u64,
    /// Retransmissions found unneeded: acknowledged sooner than any round
    /// trip after they went, so the first transmission had arrived.
    pub spurious_retransmits: u64,
    /// Acknowledgement-only datagrams sent.
    pub acks_sent: u64,
    /// Data datagrams received that were delivered or buffered.
    pub received: u64,
    /// Duplicates discarded.
    pub duplicates: u64,
    /// Datagrams buffered because they arrived early.
    pub out_of_order: u64,
    /// Datagrams discarded for being beyond the window, or further ahead of
    /// a gap than the selective ACK covers.
    pub out_of_window: u64,
    /// Peers declared lost.
    pub peers_lost: u64,
    /// Data datagrams refused for want of [`Room`].
    pub refused_no_room: u64,
    /// Zero-window probes queued: data waited but the peer's credit (or
    /// the congestion window) let nothing be in flight.
    pub probes: u64,
    /// Keepalive probes sent to idle peers under watch (see
    /// [`Config::keepalive`]).
    pub keepalives: u64,
    /// Resets sent to peers (declared lost, or heard from after that).
    pub resets_sent: u64,
    /// Calls of [`Reliability::resume`].
    pub resumes: u64,
}

/// Reliable, ordered, exactly-once delivery for every peer of an endpoint,
/// as a sans-IO state machine.
///
/// `F` names a fragment the caller sends (it keeps the bytes: retransmission
/// sends the same fragment again, nothing is copied here); `R` names a
/// receive buffer the endpoint holds while its datagram waits for an earlier
/// one.
///
/// # Driving it
///
/// * Inputs: [`send`](Self::send) (a fragment for a peer),
///   [`on_datagram`](Self::on_datagram) (a received header, its buffer and
///   the [`Room`] the caller has for it),
///   [`handle_timeout`](Self::handle_timeout) (or
///   [`handle_timeout_deferring_failures`](Self::handle_timeout_deferring_failures)
///   while datagrams may still wait to be read),
///   [`set_credit`](Self::set_credit), and [`resume`](Self::resume) after
///   the caller did not run for a while.
/// * Outputs, pulled after any input, in this order:
///   [`poll_deliver`](Self::poll_deliver) (buffers now in order),
///   [`poll_transmit`](Self::poll_transmit) (datagrams to send),
///   [`poll_event`](Self::poll_event) (fragments acknowledged or failed,
///   peers lost), [`poll_timeout`](Self::poll_timeout) (when to call
///   `handle_timeout` next).
///
/// Every entry point takes `now`; nothing reads a clock. A spurious
/// `handle_timeout` does nothing. While nothing is in flight and nothing is
/// owed, no timer is armed and `poll_timeout` is `None`.
#[derive(Debug)]
pub struct Reliability<F, R> {
    config: Config,
    peers: Vec<Peer>,
    slots: Vec<Slot<F>>,
    free_slots: Vec<u32>,
    /// Buffers that arrived early, by (peer, sequence number).
    early: HashMap<(u32, u32), R>,
    /// Buffers that became deliverable, in order.
    deliverable: VecDeque<(PeerId, R)>,
    /// Buffers the endpoint held for a peer that is gone: never deliverable.
    reclaimed: Vec<R>,
    transmits: VecDeque<Pending>,
    events: VecDeque<Event<F>>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    credit: u16,
    stats: Stats,
}

#[derive(Debug, Clone, Copy)]
enum Pending {
    Data(u32),
    Ack(u32),
    /// An acknowledgement-only datagram that asks for one back.
    Probe(u32),
    /// An acknowledgement-only datagram that tells the peer it was lost.
    Reset(u32),
}

impl<F: Clone, R> Reliability<F, R> {
    /// An endpoint with no peers.
    ///
    /// # Errors
    /// An invalid configuration.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            credit: config.window,
            config,
            peers: Vec::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            early: HashMap::new(),
            deliverable: VecDeque::new(),
            reclaimed: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            timers: BinaryHeap::new(),
            stats: Stats::default(),
        })
    }

    /// The configuration.
    pub const fn config(&self) -> &Config {
        &self.config
    }

    /// Counters.
    pub const fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Adds a peer and returns its id (ids are dense, from 0).
    pub fn add_peer(&mut self, now: Instant) -> PeerId {
        self.peers.push(Peer::new(&self.config, now));
        // A retransmission timeout queues the peer's whole window, beside an
        // acknowledgement and a probe: room for that now, so that a timeout
        // does not allocate.
        let room = self.peers.len() * (usize::from(self.config.window) + 2);
        self.transmits
            .reserve(room.saturating_sub(self.transmits.len()));
        PeerId((self.peers.len() - 1) as u32)
    }

    /// Number of peers ever added.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// The current retransmission timeout of a peer.
    pub fn rto(&self, peer: PeerId) -> Option<Duration> {
        self.peers.get(peer.0 as usize).map(|p| p.rtt.rto())
    }

    /// The smoothed round-trip time of a peer (zero before the first sample).
    pub fn srtt(&self, peer: PeerId) -> Option<Duration> {
        self.peers.get(peer.0 as usize).map(|p| p.rtt.srtt())
    }

    /// Datagrams in flight to a peer, and waiting for its window.
    pub fn queued(&self, peer: PeerId) -> Option<(usize, usize)> {
        let p = self.peers.get(peer.0 as usize)?;
        let mut backlog = 0;
        let mut at = p.backlog_head;
        while at != NIL {
            backlog += 1;
            at = self.slots[at as usize].next;
        }
        Some((usize::from(p.in_flight), backlog))
    }

    /// The newest fragment waiting in a peer's backlog (queued by
    /// [`send`](Self::send) but not yet sequenced: the window or the
    /// credit is full), if the peer is active. Such a fragment has never
    /// been handed out by [`poll_transmit`](Self::poll_transmit) and will
    /// not be before every fragment queued earlier, so its caller may still
    /// change what it carries (append another message to it) before it
    /// leaves. `None` while the backlog is empty, or the peer is unknown,
    /// closed or lost.
    pub fn backlog_tail(&self, peer: PeerId) -> Option<&F> {
        let p = self.peers.get(peer.0 as usize)?;
        if p.mode != Mode::Active || p.backlog_tail == NIL {
            return None;
        }
        self.slots
            .get(p.backlog_tail as usize)
            .map(|slot| &slot.frag)
    }

    /// `true` once the peer was declared lost.
    pub fn is_lost(&self, peer: PeerId) -> bool {
        self.peers
            .get(peer.0 as usize)
            .is_some_and(|p| p.mode == Mode::Lost)
    }

    /// Sets the credit this side advertises to every peer (datagrams past
    /// the cumulative acknowledgement it will accept), e.g. from the free
    /// share of a receive pool. Capped at the window; 0 stops the peers
    /// sending new data (they probe until credit returns). The new value
    /// rides on the next header sent to each peer; raising it queues
    /// nothing by itself, so a peer that is probing learns it from its next
    /// probe's answer (at most `rto_max` later).
    pub fn set_credit(&mut self, credit: u16) {
        self.credit = credit.min(self.config.window);
    }

    /// Size in bytes of one peer's state: constant, whatever the traffic.
    pub const fn peer_state_size() -> usize {
        size_of::<Peer>()
    }

    // ----- sending --------------------------------------------------------

    /// Queues a fragment for a peer. It is sequenced at once if the window
    /// allows, else when acknowledgements open it; either way it is
    /// retransmitted until acknowledged, and reported by an
    /// [`Event::Acked`] or, if the peer is lost, an [`Event::Failed`].
    ///
    /// # Errors
    /// An unknown, lost or closed peer; the fragment stays the caller's.
    pub fn send(&mut self, now: Instant, peer: PeerId, frag: F) -> Result<(), SendError> {
        self.queue(now, peer, frag, 0)
    }

    /// As [`send`](Self::send), for a fragment whose sender waits for its
    /// acknowledgement (its memory is released only then): every
    /// transmission asks the peer to acknowledge at once, instead of after
    /// [`Config::ack_every`] datagrams or [`Config::ack_delay`].
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
        let p = self
            .peers
            .get(peer.0 as usize)
            .ok_or(SendError::NoPeer(peer.0))?;
        match p.mode {
            Mode::Active => Ok(()),
            Mode::Lost => Err(SendError::PeerLost(peer.0)),
            Mode::Lingering(_) => Err(SendError::Closed(peer.0)),
        }
    }

    fn queue(&mut self, now: Instant, peer: PeerId, frag: F, flags: u8) -> Result<(), SendError> {
        self.accepts(peer)?;
        let slot = self.alloc_slot(Slot {
            frag,
            peer: peer.0,
            seq: SeqNum(0),
            sent_at: now,
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
        self.fill_window(now, peer.0);
        self.reschedule(peer.0);
        Ok(())
    }

    fn alloc_slot(&mut self, slot: Slot<F>) -> u32 {
        match self.free_slots.pop() {
            Some(index) => {
                self.slots[index as usize] = slot;
                index
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        }
    }

    fn append(slots: &mut [Slot<F>], head: &mut u32, tail: &mut u32, index: u32) {
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
    fn fill_window(&mut self, now: Instant, peer: u32) {
        loop {
            let p = &mut self.peers[peer as usize];
            if p.backlog_head == NIL {
                return;
            }
            if !p.can_send(&self.config) {
                if p.rto_at.is_none() {
                    p.rto_at = Some(now + p.rtt.rto());
                }
                return;
            }
            let index = p.backlog_head;
            p.backlog_head = self.slots[index as usize].next;
            if p.backlog_head == NIL {
                p.backlog_tail = NIL;
            }
            let seq = p.snd_nxt;
            p.snd_nxt = seq.next();
            p.in_flight += 1;
            p.last_data = Some(now);
            Self::append(&mut self.slots, &mut p.head, &mut p.tail, index);
            let slot = &mut self.slots[index as usize];
            slot.seq = seq;
            slot.flags |= QUEUED;
            self.transmits.push_back(Pending::Data(index));
        }
    }

    /// The next datagram to send, with its header. Acknowledgements owed to
    /// the peer ride on it.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit<F>> {
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
                    slot.flags |= SENT | if retransmission { RETRANSMITTED } else { 0 };
                    slot.sent_at = now;
                    let (peer, seq, frag) = (slot.peer, slot.seq, slot.frag.clone());
                    if retransmission {
                        self.stats.retransmitted += 1;
                    } else {
                        self.stats.sent += 1;
                    }
                    let p = &mut self.peers[peer as usize];
                    if p.rto_at.is_none() {
                        p.rto_at = Some(now + p.rtt.rto());
                    }
                    if !p.probed {
                        p.pto_at = Some(now + p.probe_timeout());
                    }
                    let p = &self.peers[peer as usize];
                    let window_full = !p.can_send(&self.config);
                    // The newest datagram of a flight of several, with
                    // nothing waiting behind it: the end of a burst.
                    let burst_end = p.tail == index && p.backlog_head == NIL && p.in_flight > 1;
                    let mut header = self.ack_header(peer);
                    header.seq = seq;
                    if retransmission || window_full || awaited || burst_end {
                        // Ask for an acknowledgement at once: the sender is
                        // waiting, to repair a loss or for window to send
                        // more, or a burst ends, whose last datagrams the
                        // receiver would otherwise acknowledge only after
                        // `ack_delay`, long after the tail-loss probe is due.
                        // Without this a window smaller than `ack_every`
                        // would also stall for `ack_delay` per window.
                        header.flags |= FLAG_ACK_REQ;
                    }
                    self.reschedule(peer);
                    return Some(Transmit {
                        peer: PeerId(peer),
                        frag: Some(frag),
                        header,
                        retransmission,
                    });
                }
                Pending::Ack(peer) => {
                    let p = &mut self.peers[peer as usize];
                    p.ack_queued = false;
                    if (p.ack_pending == 0 && !p.ack_now) || p.mode == Mode::Lost {
                        // A data datagram carried it already, or the peer
                        // is gone.
                        continue;
                    }
                    self.stats.acks_sent += 1;
                    return Some(self.control(peer, FLAG_ACK_ONLY));
                }
                Pending::Probe(peer) => {
                    if self.peers[peer as usize].mode == Mode::Lost {
                        continue;
                    }
                    return Some(self.control(peer, FLAG_ACK_ONLY | FLAG_ACK_REQ));
                }
                Pending::Reset(peer) => {
                    self.stats.resets_sent += 1;
                    return Some(self.control(peer, FLAG_ACK_ONLY | FLAG_RESET));
                }
            }
        }
        None
    }

    /// A datagram without data: an acknowledgement with `flags`.
    fn control(&mut self, peer: u32, flags: u16) -> Transmit<F> {
        let mut header = self.ack_header(peer);
        header.flags |= flags;
        header.seq = self.peers[peer as usize].snd_nxt;
        self.reschedule(peer);
        Transmit {
            peer: PeerId(peer),
            frag: None,
            header,
            retransmission: false,
        }
    }

    /// A header acknowledging what the peer sent; clears what was owed.
    fn ack_header(&mut self, peer: u32) -> rel::Repr {
        let credit = self.credit;
        let p = &mut self.peers[peer as usize];
        p.ack_pending = 0;
        p.ack_at = None;
        p.ack_now = false;
        rel::Repr {
            ack: p.rcv_nxt,
            sack: p.rcv_sack,
            credit,
            ..rel::Repr::default()
        }
    }

    fn queue_ack(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        p.ack_now = true;
        if !p.ack_queued {
            p.ack_queued = true;
            self.transmits.push_back(Pending::Ack(peer));
        }
    }

    // ----- receiving ------------------------------------------------------

    /// Handles a received datagram's reliability header; `buf` is the
    /// buffer holding it and `room` what the caller can take of its data.
    /// Acknowledgements it carries are processed first, whatever the room.
    ///
    /// * Any valid datagram shows the peer alive: its failure clock
    ///   restarts.
    /// * Data the room does not allow is refused
    ///   ([`Discard::NoRoom`]): not acknowledged (the sender retransmits
    ///   it), but an acknowledgement goes out at once with the current
    ///   credit.
    /// * An acknowledgement-only datagram that asks for one
    ///   (`FLAG_ACK_REQ`, such as a zero-window probe) is answered.
    /// * A reset ([`rel::FLAG_RESET`]) declares the peer lost
    ///   ([`LossReason::Reset`]).
    /// * A peer already declared lost is answered with a reset when it sends
    ///   data or asks for an acknowledgement, never otherwise.
    pub fn on_datagram(
        &mut self,
        now: Instant,
        peer: PeerId,
        header: &rel::Repr,
        buf: R,
        room: Room,
    ) -> Receipt<R> {
        let Some(p) = self.peers.get_mut(peer.0 as usize) else {
            return Receipt::Discard(buf, Discard::PeerLost);
        };
        if p.mode == Mode::Lost {
            // It still believes the streams alive: tell it they are broken.
            // A reset or a plain acknowledgement gets no answer, so two
            // sides that lost each other cannot loop.
            if !header.has(FLAG_RESET) && (!header.has(FLAG_ACK_ONLY) || header.has(FLAG_ACK_REQ)) {
                self.transmits.push_back(Pending::Reset(peer.0));
            }
            return Receipt::Discard(buf, Discard::PeerLost);
        }
        if !header.ack.is_after(p.snd_nxt) {
            // A plausible header (a corrupt or stale one acknowledges what
            // was never sent): the peer is alive, even if it grants nothing.
            p.last_heard = now;
        }
        self.on_ack(now, peer.0, header);
        if header.flags & (FLAG_ACK_ONLY | FLAG_RESET) != 0 {
            if header.has(FLAG_RESET) {
                self.declare_lost(peer.0, LossReason::Reset);
                return Receipt::Discard(buf, Discard::PeerLost);
            }
            if header.has(FLAG_ACK_REQ) {
                self.queue_ack(peer.0);
            }
            self.reschedule(peer.0);
            return Receipt::Discard(buf, Discard::AckOnly);
        }
        let receipt = self.on_data(now, peer.0, header, buf, room);
        self.reschedule(peer.0);
        receipt
    }

    /// Refuses a data datagram for want of room: not acknowledged, but the
    /// sender hears the current credit at once.
    fn refuse(&mut self, peer: u32, buf: R) -> Receipt<R> {
        self.stats.refused_no_room += 1;
        self.queue_ack(peer);
        Receipt::Discard(buf, Discard::NoRoom)
    }

    fn on_data(
        &mut self,
        now: Instant,
        peer: u32,
        header: &rel::Repr,
        buf: R,
        room: Room,
    ) -> Receipt<R> {
        let seq = header.seq;
        let window = i32::from(self.config.window);
        let p = &mut self.peers[peer as usize];
        let offset = seq - p.rcv_nxt;
        p.last_data = Some(now);
        if header.has(FLAG_ACK_REQ) {
            p.ack_now = true;
        }
        if offset < 0 {
            // Our acknowledgement was lost, or the datagram was duplicated:
            // acknowledge again so the sender stops.
            self.stats.duplicates += 1;
            self.queue_ack(peer);
            return Receipt::Discard(buf, Discard::Duplicate);
        }
        // Further ahead of a gap than the selective ACK can say: dropped
        // like one beyond the window, and sent again once the gap fills.
        if offset >= window || offset > SACK_SPAN {
            self.stats.out_of_window += 1;
            self.queue_ack(peer);
            return Receipt::Discard(buf, Discard::OutOfWindow);
        }
        if offset > 0 {
            let bit = 1u64 << (offset - 1);
            if p.rcv_sack & bit != 0 {
                self.stats.duplicates += 1;
                self.queue_ack(peer);
                return Receipt::Discard(buf, Discard::Duplicate);
            }
            if !room.early {
                return self.refuse(peer, buf);
            }
            p.rcv_sack |= bit;
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
        p.rcv_nxt = p.rcv_nxt.next();
        let mut delivered = 1u16;
        while p.rcv_sack & 1 != 0 {
            p.rcv_sack >>= 1;
            if let Some(early) = self.early.remove(&(peer, p.rcv_nxt.0)) {
                self.deliverable.push_back((PeerId(peer), early));
            }
            p.rcv_nxt = p.rcv_nxt.next();
            delivered += 1;
        }
        p.rcv_sack >>= 1;
        p.ack_pending = p.ack_pending.saturating_add(delivered);
        if p.ack_now || p.ack_pending >= self.config.ack_every {
            self.queue_ack(peer);
        } else if p.ack_at.is_none() {
            p.ack_at = Some(now + self.config.ack_delay);
        }
        Receipt::Deliver(buf)
    }

    /// Buffers that became deliverable, in order, after a
    /// [`Receipt::Deliver`].
    pub fn poll_deliver(&mut self) -> Option<(PeerId, R)> {
        self.deliverable.pop_front()
    }

    /// Processes the acknowledgement part of a header from `peer`.
    fn on_ack(&mut self, now: Instant, peer: u32, header: &rel::Repr) {
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
            if slot.flags & (RETRANSMITTED | SACKED) == 0 && slot.flags & SENT != 0 {
                rtt_sample = min_sample(rtt_sample, now - slot.sent_at);
            }
            if slot.flags & (RETRANSMITTED | SACKED) == RETRANSMITTED {
                repair_acked = true;
            }
            if slot.flags & (SACKED | SENT) == SENT {
                spurious += u64::from(p.rack_delivered(now, slot.sent_at, slot.flags));
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
                newly_sacked += 1;
                if slot.flags & RETRANSMITTED == 0 {
                    rtt_sample = min_sample(rtt_sample, now - slot.sent_at);
                } else {
                    repair_acked = true;
                }
                if slot.flags & SENT != 0 {
                    spurious += u64::from(p.rack_delivered(now, slot.sent_at, slot.flags));
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
        if let Some(sample) = rtt_sample.filter(|_| !repair_acked) {
            p.rtt.sample(sample, config.rto_min, config.rto_max);
            let ns = u32::try_from(sample.as_nanos()).unwrap_or(u32::MAX);
            p.min_rtt_ns = p.min_rtt_ns.min(ns.max(1));
        }
        if newly_acked > 0 {
            p.rtt.end_backoff();
            p.resumed = false;
            p.rto_at = (p.head != NIL).then(|| now + p.rtt.rto());
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
            // Something new arrived: the path works, so the retransmission
            // timer starts again, without backoff (a hole under repair does
            // not make it expire while later datagrams keep arriving, and a
            // lossy path does not keep it at its maximum), and a new probe
            // may go.
            p.rtt.end_backoff();
            p.probed = false;
            if newly_acked == 0 {
                p.rto_at = Some(now + p.rtt.rto());
            }
        }
        if probing && p.can_send(config) {
            // The window reopened: the probes' backoff says nothing about
            // the path, and the data about to go out gets a fresh timer.
            p.rtt.end_backoff();
            p.resumed = false;
            p.rto_at = None;
        }
        self.detect_losses(now, peer);
        self.fill_window(now, peer);
        self.arm_probe(now, peer);
    }

    /// Marks lost, and queues again, every datagram in flight that RACK
    /// finds lost at `now`: sent before the newest delivered one, not
    /// delivered itself, and older than a round trip plus the reordering
    /// window. A retransmission counts like any send, so a datagram lost
    /// again is found again. The earliest suspect not yet due arms
    /// `loss_at`.
    ///
    /// Congestion response: each lost datagram takes a quarter datagram off
    /// the congestion window. Random loss at rate `p` then holds the window
    /// near `4 / p` datagrams (80 at 5 %), where halving once per round trip
    /// would hold it near a handful; loss from overflow, which comes in
    /// bursts, still shrinks it fast.
    fn detect_losses(&mut self, now: Instant, peer: u32) {
        let p = &mut self.peers[peer as usize];
        p.loss_at = None;
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
            if slot.flags & QUEUED != 0 || slot.flags & SENT == 0 {
                continue;
            }
            if slot.flags & RETRANSMITTED == 0 && sacked_after >= self.config.dup_threshold {
                slot.flags |= QUEUED;
                self.transmits.push_back(Pending::Data(index));
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
                slot.flags |= QUEUED;
                self.transmits.push_back(Pending::Data(index));
                lost += 1;
            } else {
                loss_at = earliest(loss_at, Some(due));
            }
        }
        p.loss_at = loss_at;
        if lost > 0 {
            self.stats.fast_retransmits += u64::from(lost);
            let floor = 2 * CWND_UNIT;
            p.cwnd = p.cwnd.saturating_sub(lost * CWND_UNIT / 4).max(floor);
            p.ssthresh = p.cwnd;
        }
    }

    /// Arms the tail-loss probe: while data is in flight and no probe is
    /// out, two smoothed round trips after now (or after the first send,
    /// before any sample, the initial timeout).
    fn arm_probe(&mut self, now: Instant, peer: u32) {
        let p = &mut self.peers[peer as usize];
        p.pto_at = (p.head != NIL && !p.probed).then(|| now + p.probe_timeout());
    }

    // ----- timers ---------------------------------------------------------

    /// When [`handle_timeout`](Self::handle_timeout) should next be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        // Drop entries whose peer rescheduled or no longer needs a timer, so
        // an idle endpoint reports no deadline at all.
        while let Some(Reverse((at, peer))) = self.timers.peek().copied() {
            if self.peers[peer as usize].scheduled == Some(at) {
                return Some(at);
            }
            self.timers.pop();
        }
        None
    }

    /// Fires every timer due at `now`: retransmission timeouts and
    /// zero-window probes, delayed acknowledgements, peer failure detection
    /// and the end of lingering.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.fire(now, false);
    }

    /// Fires every timer due at `now` as [`handle_timeout`](Self::handle_timeout)
    /// does, except that no peer is declared lost: the caller has not read
    /// everything the fabric holds, and an acknowledgement may wait there.
    /// A peer whose failure deadline passed keeps a deadline (in the past)
    /// in [`poll_timeout`](Self::poll_timeout) and is examined again by the
    /// next call of either method. So a caller must not call this method
    /// again merely because that deadline is past: it reads its input
    /// first, then calls [`handle_timeout`](Self::handle_timeout).
    pub fn handle_timeout_deferring_failures(&mut self, now: Instant) {
        self.fire(now, true);
    }

    fn fire(&mut self, now: Instant, defer_failures: bool) {
        // Peers whose failure was deferred: their deadline is in the past,
        // so they are pushed back only after the loop, or it would pop them
        // again and again.
        let mut deferred = Vec::new();
        while let Some(Reverse((at, peer))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if self.peers[peer as usize].scheduled != Some(at) {
                continue;
            }
            self.peers[peer as usize].scheduled = None;
            if self.expire(now, peer, defer_failures) {
                deferred.push(peer);
            } else {
                self.reschedule(peer);
            }
        }
        for peer in deferred {
            let p = &self.peers[peer as usize];
            let next = earliest(p.next_deadline(&self.config), p.fail_at(&self.config));
            self.schedule(peer, next);
        }
    }

    /// Handles the peer's due timers. Returns `true` if its failure was due
    /// but deferred.
    fn expire(&mut self, now: Instant, peer: u32, defer_failure: bool) -> bool {
        let rto_max = self.config.rto_max;
        let p = &mut self.peers[peer as usize];
        let mut deferred = false;
        if p.fail_at(&self.config).is_some_and(|at| at <= now) {
            if !defer_failure {
                self.declare_lost(peer, LossReason::Timeout);
                return false;
            }
            deferred = true;
        }
        if let Mode::Lingering(until) = p.mode {
            if until <= now {
                // Done lingering. What the peer never acknowledged fails:
                // the caller closed it, and waiting longer would keep a
                // deadline in the past.
                self.end_peer(peer);
                self.events
                    .push_back(Event::PeerClosed { peer: PeerId(peer) });
                return deferred;
            }
        }
        if p.ack_at.is_some_and(|at| at <= now) {
            p.ack_at = None;
            self.queue_ack(peer);
        }
        let p = &mut self.peers[peer as usize];
        if p.rto_at.is_none() && p.keepalive_at(&self.config).is_some_and(|at| at <= now) {
            p.last_keepalive = Some(now);
            self.stats.keepalives += 1;
            self.transmits.push_back(Pending::Probe(peer));
        }
        if self.peers[peer as usize]
            .loss_at
            .is_some_and(|at| at <= now)
        {
            self.detect_losses(now, peer);
        }
        let p = &mut self.peers[peer as usize];
        if p.pto_at.is_some_and(|at| at <= now) {
            p.pto_at = None;
            self.probe_tail(peer);
        }
        let p = &mut self.peers[peer as usize];
        if p.rto_at.is_none_or(|at| at > now) {
            return deferred;
        }
        // After `resume` the timer refreshes the state without backing off:
        // the caller not running is no evidence against the path.
        let resumed = core::mem::take(&mut p.resumed);
        if p.head == NIL {
            if p.backlog_head == NIL {
                p.rto_at = None;
            } else {
                // Data waits but the peer's credit lets nothing fly: ask
                // it for an acknowledgement, which carries its credit.
                self.stats.probes += 1;
                if !resumed {
                    p.rtt.back_off(rto_max);
                }
                p.rto_at = Some(now + p.rtt.rto());
                self.transmits.push_back(Pending::Probe(peer));
            }
            return deferred;
        }
        if !resumed {
            self.stats.timeouts += 1;
            p.rtt.back_off(rto_max);
            p.ssthresh = (p.cwnd / 2).max(2 * CWND_UNIT);
            p.cwnd = CWND_UNIT;
        }
        p.rto_at = Some(now + p.rtt.rto());
        // The congestion window is one datagram now: resend the oldest not
        // known delivered, asking for an acknowledgement. Its answer tells
        // RACK what else is missing (what was sent before it and is still
        // not delivered a round trip later), so a spurious timeout (a
        // receiver descheduled for a while) costs one datagram, and a real
        // one repairs the rest at the pace acknowledgements come back.
        let mut at = p.head;
        while at != NIL {
            let slot = &mut self.slots[at as usize];
            if slot.flags & (SACKED | QUEUED) == 0 {
                slot.flags |= QUEUED;
                self.transmits.push_back(Pending::Data(at));
                break;
            }
            at = slot.next;
        }
        deferred
    }

    /// Sends the tail-loss probe: the newest datagram in flight that is
    /// neither known delivered nor queued goes again, asking for an
    /// acknowledgement at once. Whether it or an earlier one was lost, the
    /// answer lets RACK see it.
    fn probe_tail(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        if p.head == NIL || p.probed {
            return;
        }
        p.probed = true;
        let mut newest = None;
        let mut at = p.head;
        while at != NIL {
            let slot = &self.slots[at as usize];
            if slot.flags & (SACKED | QUEUED) == 0 && slot.flags & SENT != 0 {
                newest = Some(at);
            }
            at = slot.next;
        }
        if let Some(index) = newest {
            self.slots[index as usize].flags |= QUEUED;
            self.transmits.push_back(Pending::Data(index));
            self.stats.tail_probes += 1;
        }
    }

    /// The caller did not run for a while (its process was stopped or
    /// starved, and its clock jumped): that is no evidence against any
    /// peer. Every peer's failure clock restarts at `now`; a peer with data
    /// waiting gets its retransmission timer due at `now`, so its state
    /// refreshes at once (retransmission or probe) with a normal timeout
    /// afterwards, not a backed-off one; every timer is rescheduled.
    pub fn resume(&mut self, now: Instant) {
        self.stats.resumes += 1;
        self.timers.clear();
        for p in &mut self.peers {
            p.scheduled = None;
            p.last_heard = now;
            // Probe and loss timers count from sends made before the gap:
            // the refresh below replaces them.
            p.pto_at = None;
            p.loss_at = None;
            p.probed = false;
            if p.mode != Mode::Lost && (p.head != NIL || p.backlog_head != NIL) {
                p.rtt.end_backoff();
                p.rto_at = Some(now);
                p.resumed = true;
            }
        }
        for peer in 0..self.peers.len() {
            self.reschedule(peer as u32);
        }
    }

    fn declare_lost(&mut self, peer: u32, reason: LossReason) {
        self.stats.peers_lost += 1;
        self.end_peer(peer);
        if reason == LossReason::Timeout {
            // Tell the peer, in case it still hears us: it must not wait
            // for a stream this side abandoned.
            self.transmits.push_back(Pending::Reset(peer));
        }
        self.events.push_back(Event::PeerLost {
            peer: PeerId(peer),
            reason,
        });
    }

    /// Ends a peer's streams: it becomes [`Mode::Lost`], its timers stop,
    /// every fragment not yet reported fails, and the buffers held for it
    /// are taken back.
    fn end_peer(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        p.mode = Mode::Lost;
        p.rto_at = None;
        p.ack_at = None;
        p.loss_at = None;
        p.pto_at = None;
        p.resumed = false;
        // Its timer entry, if any, is left to be dropped as stale.
        p.scheduled = None;
        for list in [(p.head, true), (p.backlog_head, false)] {
            let mut at = list.0;
            while at != NIL {
                let slot = &mut self.slots[at as usize];
                slot.flags &= !QUEUED;
                if slot.flags & RELEASED == 0 {
                    self.events.push_back(Event::Failed {
                        peer: PeerId(peer),
                        frag: slot.frag.clone(),
                    });
                }
                self.free_slots.push(at);
                at = slot.next;
            }
        }
        let p = &mut self.peers[peer as usize];
        p.head = NIL;
        p.tail = NIL;
        p.backlog_head = NIL;
        p.backlog_tail = NIL;
        p.in_flight = 0;
        p.sacked = 0;
        self.reclaim_early(peer);
    }

    /// Takes back the buffers held for a peer whose gap will never fill.
    fn reclaim_early(&mut self, peer: u32) {
        let keys: Vec<(u32, u32)> = self
            .early
            .keys()
            .filter(|(owner, _)| *owner == peer)
            .copied()
            .collect();
        for key in keys {
            if let Some(buf) = self.early.remove(&key) {
                self.reclaimed.push(buf);
            }
        }
        self.peers[peer as usize].rcv_sack = 0;
    }

    /// A buffer the endpoint no longer holds (its peer was lost or closed
    /// with a gap): the caller reuses it.
    pub fn poll_reclaim(&mut self) -> Option<R> {
        self.reclaimed.pop()
    }

    /// Stops sending to a peer. It lingers for the configured time, still
    /// acknowledging late retransmissions, delivering what arrives and
    /// retransmitting what it was sent, and then an [`Event::PeerClosed`]
    /// reports it gone; a fragment it had still not acknowledged by then
    /// fails ([`Event::Failed`]) first.
    pub fn close_peer(&mut self, now: Instant, peer: PeerId) {
        let linger = self.config.linger;
        if let Some(p) = self.peers.get_mut(peer.0 as usize) {
            if p.mode == Mode::Active {
                p.mode = Mode::Lingering(now + linger);
                self.reschedule(peer.0);
            }
        }
    }

    /// Makes sure the timer heap has an entry for the peer's next deadline.
    fn reschedule(&mut self, peer: u32) {
        let next = self.peers[peer as usize].next_deadline(&self.config);
        self.schedule(peer, next);
    }

    /// Makes sure the timer heap has an entry no later than `next`.
    fn schedule(&mut self, peer: u32, next: Option<Instant>) {
        let p = &mut self.peers[peer as usize];
        // With nothing due, an existing entry is left to fire and find
        // nothing: cheaper than removing it now and pushing another at the
        // next send.
        let Some(next) = next else {
            return;
        };
        // An existing entry that fires no later is enough: when it fires
        // early the deadline is recomputed and pushed again.
        if p.scheduled.is_some_and(|at| at <= next) {
            return;
        }
        p.scheduled = Some(next);
        // Entries a peer replaced with an earlier one stay in the heap until
        // they come up (a keepalive's a quarter of peer_timeout away): drop
        // them before the heap would grow, so that it holds about one entry
        // per peer and stops allocating once warm, instead of growing with
        // the sends of the last peer_timeout.
        if self.timers.len() == self.timers.capacity() {
            let peers = &self.peers;
            self.timers
                .retain(|&Reverse((at, peer))| peers[peer as usize].scheduled == Some(at));
        }
        self.timers.push(Reverse((next, peer)));
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event<F>> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_tail_is_the_newest_unsequenced_fragment() {
        let config = Config {
            window: 2,
            initial_cwnd: 2,
            initial_credit: 2,
            ..Config::default()
        };
        let mut r: Reliability<u32, u32> = Reliability::new(config).expect("config");
        let now = Instant::from_nanos(0);
        let peer = r.add_peer(now);
        assert_eq!(r.backlog_tail(peer), None);
        assert_eq!(r.backlog_tail(PeerId(9)), None);
        // The first two are sequenced at once: no backlog.
        r.send(now, peer, 1).expect("send");
        r.send(now, peer, 2).expect("send");
        assert_eq!(r.backlog_tail(peer), None);
        r.send(now, peer, 3).expect("send");
        assert_eq!(r.backlog_tail(peer), Some(&3));
        r.send(now, peer, 4).expect("send");
        assert_eq!(r.backlog_tail(peer), Some(&4));
        assert_eq!(r.queued(peer), Some((2, 2)));
        // Only what is in flight is handed out for transmission.
        let mut sent = Vec::new();
        while let Some(tx) = r.poll_transmit(now) {
            sent.extend(tx.frag);
        }
        assert_eq!(sent, [1, 2]);
        // A closed peer has no backlog to add to.
        r.close_peer(now, peer);
        assert_eq!(r.backlog_tail(peer), None);
    }

    #[test]
    fn replaced_timer_entries_do_not_pile_up() {
        let mut r: Reliability<u32, u32> = Reliability::new(Config::default()).expect("config");
        let peer = r.add_peer(Instant::from_nanos(0));
        for i in 0..10_000u64 {
            let now = Instant::from_duration(Duration::from_millis(i));
            // The peer turns idle (a keepalive, far away), then busy again
            // (a retransmission timeout, sooner): the keepalive's entry is
            // replaced, and stays in the heap until it comes up.
            r.peers[peer.0 as usize].scheduled = None;
            r.schedule(peer.0, Some(now + Duration::from_secs(7)));
            r.schedule(peer.0, Some(now + Duration::from_millis(5)));
        }
        assert!(r.timers.len() <= 8, "{} entries", r.timers.len());
        assert!(
            r.timers.capacity() <= 16,
            "capacity {}",
            r.timers.capacity()
        );
        let at = r.poll_timeout().expect("a deadline");
        assert_eq!(at, Instant::from_duration(Duration::from_millis(9_999 + 5)));
    }
}
