//! The types [`Reliability`](super::Reliability) exchanges with its
//! caller: peer ids, receipts for received datagrams, datagrams to send,
//! events, errors and counters.

use crate::time::Instant;
use udbtl_wire::SeqNum;
use udbtl_wire::datagram::Epochs;
use udbtl_wire::rel;

/// A peer, as numbered by the caller (an index into its own peer table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// What to do with a received datagram's buffer.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum Receipt<R> {
    /// Next in order: deliver it now, then drain [`Reliability::poll_deliver`](crate::Reliability::poll_deliver).
    Deliver(R),
    /// Arrived early: the state keeps the buffer until its turn.
    Buffered,
    /// Not to be delivered (duplicate, outside the window, acknowledgement
    /// only, from a lost peer, or refused for want of [`Room`]): the caller
    /// reuses the buffer.
    Discard(R, Discard),
}

/// Where a peer's two streams start: the first sequence number this side
/// sends it, and the first it expects from it. Both ends must agree, and
/// an off-path forger must not be able to guess them; see
/// [`Reliability::add_peer_at`](crate::Reliability::add_peer_at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStart {
    /// The first sequence number sent to the peer.
    pub send: SeqNum,
    /// The first sequence number expected from the peer.
    pub recv: SeqNum,
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
    /// It could not have come from the peer as it stands (RFC 5961): it
    /// acknowledges what was never sent or lies further back than a
    /// window, or it resets the streams at a sequence number other than
    /// the next one expected. It does not count as hearing from the peer.
    Unacceptable,
}

/// What the caller can take of a received data datagram, passed to
/// [`Reliability::on_datagram`](crate::Reliability::on_datagram). A datagram that needs what is not allowed
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
    /// The epochs of `header`'s `seq` and `ack`, which a seal must cover
    /// (see [`Epochs`]); the receiver's
    /// [`Reliability::epochs_of`](crate::Reliability::epochs_of) gives the
    /// same.
    pub epochs: Epochs,
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
    /// Tail-loss probes sent: acknowledgement requests, after two round
    /// trips without an acknowledgement while data was in flight. What
    /// their answers show lost counts in `fast_retransmits`.
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
    /// Datagrams discarded for being beyond the window.
    pub out_of_window: u64,
    /// Peers declared lost.
    pub peers_lost: u64,
    /// Data datagrams refused for want of [`Room`].
    pub refused_no_room: u64,
    /// Zero-window probes queued: data waited but the peer's credit (or
    /// the congestion window) let nothing be in flight.
    pub probes: u64,
    /// Keepalive probes sent to idle peers under watch (see
    /// [`Config::keepalive`](crate::Config::keepalive)).
    pub keepalives: u64,
    /// Resets sent to peers (declared lost, or heard from after that).
    pub resets_sent: u64,
    /// Datagrams dropped whose acknowledgement the peer could not have
    /// sent: of data never sent, or older than a window behind the oldest
    /// unacknowledged datagram ([`Discard::Unacceptable`]).
    pub unacceptable_acks: u64,
    /// Resets dropped for not carrying the next sequence number expected
    /// ([`Discard::Unacceptable`]). One within the window draws a
    /// challenge acknowledgement.
    pub unacceptable_resets: u64,
    /// Challenge acknowledgements sent: a peer that really reset its
    /// streams answers one with a reset at the exact sequence number.
    pub challenge_acks: u64,
    /// Acknowledgements sent at once to a peer told a credit of 0, when
    /// its credit came back.
    pub credit_updates: u64,
    /// Calls of [`Reliability::resume`](crate::Reliability::resume).
    pub resumes: u64,
}

/// Where a peer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Active,
    /// Closed by the caller: no new sends; still acknowledges until then.
    Lingering(Instant),
    /// Declared lost (nothing heard for `peer_timeout` while data waited,
    /// or the peer sent a reset), or finished lingering. It holds the
    /// sequence number the next reset to the peer carries: the
    /// acknowledgement number of the datagram the reset answers, which is
    /// the next sequence number the peer expects (RFC 793), the only one at
    /// which it accepts a reset.
    Lost(SeqNum),
}

impl Mode {
    pub(super) const fn is_lost(self) -> bool {
        matches!(self, Self::Lost(_))
    }
}
