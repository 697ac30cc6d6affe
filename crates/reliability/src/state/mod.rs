//! The protocol state of every peer of one process: [`Reliability`], split
//! by concern. Each submodule holds one part of the state machine:
//!
//! * `types`: what the caller exchanges with it ([`PeerId`], [`Receipt`],
//!   [`Transmit`], [`Event`], [`Stats`], ...);
//! * `peer`: one peer's state and the shared slot table's entries;
//! * `peers`: every peer's state, made when the peer first talks;
//! * `send`: the backlog, the send window and handing out datagrams;
//! * `recv`: the receive window, early datagrams, duplicates, delivery;
//! * `ack`: acknowledgements built and processed;
//! * `loss`: loss detection, fast retransmission and tail-loss probes;
//! * `timer`: per-peer deadlines and firing them;
//! * `failure`: peer failure by time, keepalives, resets and closing;
//! * `credit`: the credit advertised, shared among the peers that send.

mod ack;
mod credit;
mod failure;
mod loss;
mod peer;
mod peers;
mod recv;
mod send;
mod timer;
mod timer_table;
mod types;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

pub use types::{
    Discard, Event, LossReason, PeerId, Receipt, Room, SendError, Stats, StreamStart, Transmit,
};

use udbtl_wire::datagram::Epochs;

use crate::config::{Config, ConfigError};
use crate::time::Instant;
use peer::{NIL, Slot};
use peers::Peers;
use types::Mode;

/// Reliable, ordered, exactly-once delivery for every peer of one process,
/// as a sans-IO state machine.
///
/// `F` names a fragment the caller sends (it keeps the bytes: retransmission
/// sends the same fragment again, nothing is copied here); `R` names a
/// receive buffer the state holds while its datagram waits for an earlier
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
/// `handle_timeout` does nothing. Once nothing is in flight and nothing is
/// owed, no new deadline is armed, but the last one a peer armed is not
/// withdrawn: `poll_timeout` still reports it, its `handle_timeout` finds
/// nothing due, and `poll_timeout` is `None` after that.
#[derive(Debug)]
pub struct Reliability<F, R> {
    config: Config,
    peers: Peers,
    slots: Vec<Slot<F>>,
    free_slots: Vec<u32>,
    /// Buffers that arrived early, by (peer, sequence number).
    early: HashMap<(u32, u32), R>,
    /// Buffers that became deliverable, in order.
    deliverable: VecDeque<(PeerId, R)>,
    /// Buffers the state held for a peer that is gone: never deliverable.
    reclaimed: Vec<R>,
    transmits: VecDeque<Pending>,
    /// Acknowledgement-only datagrams are held back (`hold_acks`).
    acks_held: bool,
    /// Peers whose acknowledgement-only datagram is held back.
    held_acks: Vec<u32>,
    /// When the last challenge acknowledgement went (for a reset at an
    /// unexpected sequence number): at most one per `rto_min`, whatever the
    /// peer, so forged resets cannot make this side flood its peers.
    last_challenge: Option<Instant>,
    events: VecDeque<Event<F>>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    credit: credit::Credit,
    stats: Stats,
}

/// Transmit queue entries one peer can have besides its data: an
/// acknowledgement, a probe and a reset.
const TRANSMITS_PER_PEER: usize = 3;

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
    /// A state with no peers.
    ///
    /// # Errors
    /// An invalid configuration.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            credit: credit::Credit::fixed(config.window),
            config,
            peers: Peers::default(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            early: HashMap::new(),
            deliverable: VecDeque::new(),
            reclaimed: Vec::new(),
            transmits: VecDeque::new(),
            acks_held: false,
            last_challenge: None,
            held_acks: Vec::new(),
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

    /// Adds a peer whose streams both start at the configuration's
    /// `initial_seq`, and returns its id (ids are dense, from 0). For
    /// tests and closed networks: a forger who knows where the streams
    /// are can guess the numbers a reset or an acknowledgement needs. See
    /// [`add_peer_at`](Self::add_peer_at).
    pub fn add_peer(&mut self) -> PeerId {
        let start = self.config.initial_seq;
        self.add_peer_at(StreamStart {
            send: start,
            recv: start,
        })
    }

    /// Adds a peer whose streams start at `start`, and returns its id (ids
    /// are dense, from 0). The peer must add this side with the two
    /// numbers swapped. Numbers drawn at random per peer pair and
    /// incarnation keep a forger who cannot read the traffic from placing
    /// a reset or an acknowledgement where this side accepts it.
    ///
    /// The peer is dormant until something is sent to or received from it:
    /// it keeps [`bytes_per_idle_peer`](Self::bytes_per_idle_peer) until
    /// then, and its clocks start when it wakes.
    pub fn add_peer_at(&mut self, start: StreamStart) -> PeerId {
        let id = self.peers.add(start);
        self.refresh_credit();
        PeerId(id)
    }

    /// Makes `peer`'s state now if it was dormant (see
    /// [`add_peer_at`](Self::add_peer_at)), with room for what it can
    /// queue; `false` for an unknown peer. Once awake, one lookup.
    fn wake(&mut self, now: Instant, peer: u32) -> bool {
        match self.peers.wake(peer as usize, &self.config, now) {
            None => false,
            Some(false) => true,
            Some(true) => {
                self.held_acks.reserve(
                    self.peers
                        .awake_capacity()
                        .saturating_sub(self.held_acks.len()),
                );
                self.reserve_transmits();
                true
            }
        }
    }

    /// Makes room in the transmit queue for everything that can wait there
    /// at once, so that queueing never allocates: each slot's datagram at
    /// most once (a slot is queued again only after it left), and per peer
    /// that woke an acknowledgement, a probe and a reset. Called as slots
    /// are added and peers wake; the room grows with the datagrams in
    /// flight and the peers that talk, not with peers × window.
    fn reserve_transmits(&mut self) {
        let room = self.slots.capacity() + TRANSMITS_PER_PEER * self.peers.awake_capacity();
        self.transmits
            .reserve(room.saturating_sub(self.transmits.len()));
    }

    /// Makes room for `additional` more peers at once, so that adding a
    /// whole job's peers grows the table once, to fit, rather than
    /// doubling past it.
    pub fn reserve_peers(&mut self, additional: usize) {
        self.peers.reserve(additional);
    }

    /// Number of peers ever added.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Number of peers that were sent to or received from: the others are
    /// dormant (see [`add_peer_at`](Self::add_peer_at)).
    pub fn awake_peers(&self) -> usize {
        self.peers.awake()
    }

    /// The current retransmission timeout of a peer.
    pub fn rto(&self, peer: PeerId) -> Option<Duration> {
        self.view(peer, |p| p.rtt.rto())
    }

    /// The smoothed round-trip time of a peer (zero before the first sample).
    pub fn srtt(&self, peer: PeerId) -> Option<Duration> {
        self.view(peer, |p| p.rtt.srtt())
    }

    /// The congestion window towards a peer, in whole datagrams (at least
    /// one).
    pub fn cwnd(&self, peer: PeerId) -> Option<u32> {
        self.view(peer, |p| (p.cwnd / peer::CWND_UNIT).max(1))
    }

    /// Datagrams in flight to a peer, and waiting for its window.
    pub fn queued(&self, peer: PeerId) -> Option<(usize, usize)> {
        self.view(peer, |p| (usize::from(p.in_flight), p.backlog_len as usize))
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

    /// The epochs a datagram from `peer` with `header` was sealed with
    /// (see [`Transmit::epochs`]), for opening its seal before anything
    /// else about it; zero for a peer not added yet, whose streams have
    /// not wrapped.
    pub fn epochs_of(&self, peer: PeerId, header: &udbtl_wire::rel::Repr) -> Epochs {
        self.view(peer, |p| p.epochs_received(header))
            .unwrap_or_default()
    }

    /// `true` once the peer was declared lost.
    pub fn is_lost(&self, peer: PeerId) -> bool {
        self.peers
            .get(peer.0 as usize)
            .is_some_and(|p| p.mode.is_lost())
    }

    /// Runs `f` on `peer`'s state, or on the state a dormant peer would
    /// wake with; `None` for an unknown peer.
    fn view<T>(&self, peer: PeerId, f: impl FnOnce(&peer::Peer) -> T) -> Option<T> {
        self.peers.view(peer.0 as usize, &self.config, f)
    }

    /// Peers that sent data within the credit horizon (see
    /// [`share_credit`](Self::share_credit)).
    pub fn active_peers(&self) -> usize {
        self.credit.active_peers()
    }

    /// Size in bytes of the state of a peer that was sent to or received
    /// from: constant, whatever the traffic.
    pub const fn peer_state_size() -> usize {
        size_of::<peer::Peer>()
    }

    /// Heap bytes the state keeps per peer nothing was sent to or received
    /// from (a dormant peer).
    pub const fn bytes_per_idle_peer() -> usize {
        peers::DORMANT_BYTES
    }

    /// Heap bytes the state keeps per peer that was sent to or received
    /// from: its state, and the room reserved for it in the transmit queue
    /// and the list of peers owed an acknowledgement. Datagrams in flight
    /// and early ones take slots on top, per datagram.
    pub const fn bytes_per_active_peer() -> usize {
        peers::DORMANT_BYTES
            + peers::AWAKE_BYTES
            + TRANSMITS_PER_PEER * size_of::<Pending>()
            + size_of::<u32>()
    }

    /// The most buffers the active peers share under
    /// [`share_credit`](Self::share_credit), together.
    pub const fn active_credit_max(&self) -> usize {
        credit::active_credit_max(self.config.window)
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
        let peer = r.add_peer();
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
}
