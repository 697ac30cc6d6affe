//! Reliable, ordered, exactly-once delivery over unreliable datagrams, as a
//! sans-IO state machine.
//!
//! [`Reliability`] keeps, for every peer, a sequence-numbered stream in each
//! direction. It never touches sockets, clocks or threads: the caller passes
//! `now` into every call, hands it received headers, and pulls out what to
//! transmit, what to deliver and what happened (see the type's docs for the
//! drive order).
//!
//! # Protocol
//!
//! * Every data datagram carries a per-peer [`SeqNum`](udbtl_wire::SeqNum)
//!   (wrap-safe), the cumulative ACK of the reverse stream, a 64-bit
//!   selective ACK and the receiver's credit ([`udbtl_wire::rel`]).
//! * The receiver buffers datagrams that arrive early, inside the window,
//!   instead of dropping them (UCX and libfabric's rxd drop them), delivers
//!   in order, and discards duplicates. It acknowledges at once on a gap, a
//!   duplicate or a request (`FLAG_ACK_REQ`, also on an
//!   acknowledgement-only datagram), after `ack_every` datagrams, or after
//!   `ack_delay` when no reverse traffic carries the acknowledgement.
//! * The caller says, per datagram, whether it has room for it
//!   ([`Room`]): one it cannot take is refused, not acknowledged, and
//!   retransmitted later, so a full receive pool never deadlocks. The
//!   credit it advertises ([`Reliability::set_credit`], possibly 0) tells
//!   senders how much to send.
//! * The sender keeps at most min(congestion window, credit, `window`)
//!   datagrams in flight, assuming `initial_credit` until the peer's first
//!   header. Losses are found mostly without a timeout:
//!   * by time (RACK, RFC 8985): a datagram sent before one that was
//!     delivered, and not delivered itself a round trip plus a quarter of the
//!     smallest round trip after it went, is lost; a retransmission is
//!     judged like any send, so a datagram lost again is found again;
//!   * at once, a first transmission that `dup_threshold` later ones
//!     overtook;
//!   * at the tail, by a probe: with data in flight and nothing acknowledged
//!     for two round trips, the newest datagram goes again asking for an
//!     acknowledgement, whose answer shows what is missing. The last
//!     datagram of a burst asks for an acknowledgement at once, so the
//!     receiver's delayed acknowledgement does not set the probe off.
//!
//!   The retransmission timeout (RFC 6298, Karn, exponential backoff, at
//!   least `rto_min`) is the last resort; it resends only the oldest
//!   datagram not known delivered, its answer leading to the rest.
//!   Retransmissions acknowledged sooner than any round trip are counted
//!   as spurious. The congestion window grows additively and loses a
//!   quarter datagram per lost datagram, so random loss does not collapse
//!   it while bursts of loss still shrink it fast; a timeout drops it to
//!   one datagram.
//!   When data waits but the credit lets nothing fly, the timer sends
//!   zero-window probes (acknowledgement requests) with the same backoff.
//! * A peer from which nothing is heard for `peer_timeout` (time, not a
//!   retry count) while data waits for it is declared lost: its fragments
//!   fail, other peers are unaffected. Any valid datagram, an answer to a
//!   probe included, restarts that clock: a busy receiver that grants no
//!   credit is alive. The lost peer is sent a reset (`FLAG_RESET`), and
//!   answered with one whenever it sends data or asks for an
//!   acknowledgement; a peer that receives a reset declares the sender lost
//!   too ([`LossReason::Reset`]). Failures can be deferred until the caller
//!   has drained its input
//!   ([`Reliability::handle_timeout_deferring_failures`]), and a caller
//!   that was not running restarts every clock with
//!   [`Reliability::resume`]. A closed peer lingers to acknowledge late
//!   retransmissions.
//! * Per-peer state has a constant size ([`Reliability::peer_state_size`]),
//!   made only when the peer is first sent to or heard from: until then it
//!   keeps where its streams start
//!   ([`Reliability::bytes_per_idle_peer`]). Datagrams in flight live in a
//!   table shared by all peers.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod rtt;
mod state;
mod time;

pub use config::{Config, ConfigError, MAX_WINDOW, SACK_SPAN};
pub use state::{
    Discard, Event, LossReason, PeerId, Receipt, Reliability, Room, SendError, Stats, StreamStart,
    Transmit,
};
pub use time::Instant;
