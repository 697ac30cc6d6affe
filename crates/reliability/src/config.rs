//! Protocol parameters.

use core::time::Duration;

use udbtl_wire::SeqNum;

/// The most datagrams a peer may have in flight. Between hosts a datagram is
/// one MTU, so a window of 64 would cap a stream at ~90 KB per round trip.
/// A multiple of 64 (the receiver keeps a bit per sequence number of the
/// window) that divides 2^32.
///
/// A receiver buffers whatever arrives within the window, however far past
/// a gap; the selective ACK names only the first [`SACK_SPAN`] of them, and
/// the cumulative ACK covers the rest once the gap fills, so a lost datagram
/// costs one resend at any window.
pub const MAX_WINDOW: u16 = 1024;

/// Sequence numbers past the cumulative ACK that the selective ACK covers.
pub const SACK_SPAN: i32 = 64;

/// Parameters of the reliability protocol, shared by every peer of one
/// process's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Most datagrams in flight per peer (a cap on the congestion window),
    /// and the credit this side advertises: at most [`MAX_WINDOW`].
    pub window: u16,
    /// Congestion window a peer starts with, in datagrams.
    pub initial_cwnd: u16,
    /// Credit a sender assumes before the peer's first header tells it the
    /// real one: its first burst cannot flood a small receive pool.
    /// `1..=window`.
    pub initial_credit: u16,
    /// Retransmission timeout before the first RTT sample.
    pub rto_initial: Duration,
    /// Smallest retransmission timeout.
    pub rto_min: Duration,
    /// Largest retransmission timeout, backoff included.
    pub rto_max: Duration,
    /// Longest a received datagram waits for its acknowledgement when no
    /// reverse traffic carries it.
    pub ack_delay: Duration,
    /// Acknowledge at once after this many datagrams without one.
    pub ack_every: u16,
    /// A peer from which nothing is heard for this long, while data waits
    /// for it, is declared lost. Time, not a retry count, decides; any valid
    /// datagram from the peer (an answer to a probe included) restarts it,
    /// or only news with [`strict_liveness`](Self::strict_liveness).
    pub peer_timeout: Duration,
    /// Only news shows a peer alive: data not received before, an
    /// acknowledgement of data not acknowledged before, or the answer to a
    /// probe (which echoes the probe's token, the time it was sent), and
    /// every retransmission timeout sends a probe beside the resend. A copy
    /// of an old datagram then keeps no dead peer alive, which matters
    /// where copies verify: with authentication, anyone on the path can
    /// replay a genuine datagram. Without it, forging is as easy as
    /// replaying, and a peer whose receive pool is too small to take even a
    /// probe for `peer_timeout` is still alive by its acknowledgements.
    pub strict_liveness: bool,
    /// Keep watching a peer for a while after data last flowed either way:
    /// while nothing is owed either way, probe it every quarter of
    /// `peer_timeout` until it has answered for a whole `peer_timeout`, and
    /// declare it lost if nothing is heard for `peer_timeout`. Without this,
    /// a peer that dies while this side only waits for its data (an MPI
    /// receive) is never noticed. A few probes per idle spell, per peer that
    /// was active.
    pub keepalive: bool,
    /// A peer that sent data within this long is *active*: it shares most
    /// of the receive pool under [`Reliability::share_credit`](crate::Reliability::share_credit).
    pub credit_horizon: Duration,
    /// How long a closed peer lingers, still acknowledging late datagrams.
    pub linger: Duration,
    /// A first transmission is presumed lost at once when this many later
    /// datagrams were selectively acknowledged (time decides otherwise).
    pub dup_threshold: u32,
    /// First sequence number of every stream (both sides must agree).
    pub initial_seq: SeqNum,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            window: 64,
            initial_cwnd: 16,
            initial_credit: 4,
            rto_initial: Duration::from_millis(20),
            rto_min: Duration::from_micros(100),
            rto_max: Duration::from_secs(2),
            ack_delay: Duration::from_micros(500),
            ack_every: 16,
            peer_timeout: Duration::from_secs(30),
            linger: Duration::from_secs(10),
            credit_horizon: Duration::from_millis(20),
            dup_threshold: 3,
            initial_seq: SeqNum(0),
            keepalive: false,
            strict_liveness: false,
        }
    }
}

/// A configuration value out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid reliability setting {name}: {reason}")]
pub struct ConfigError {
    /// The field.
    pub name: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl Config {
    /// Checks every field.
    ///
    /// # Errors
    /// The first field out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |name, reason: String| Err(ConfigError { name, reason });
        if self.window == 0 || self.window > MAX_WINDOW {
            return fail(
                "window",
                format!("{} is outside 1..={MAX_WINDOW}", self.window),
            );
        }
        if self.initial_cwnd == 0 {
            return fail("initial_cwnd", "must be at least 1".into());
        }
        if self.initial_credit == 0 || self.initial_credit > self.window {
            return fail(
                "initial_credit",
                format!(
                    "{} is outside 1..=window ({})",
                    self.initial_credit, self.window
                ),
            );
        }
        if self.rto_min.is_zero() || self.rto_min > self.rto_max {
            return fail(
                "rto_min",
                format!(
                    "{:?} must be positive and at most rto_max {:?}",
                    self.rto_min, self.rto_max
                ),
            );
        }
        if self.rto_initial < self.rto_min || self.rto_initial > self.rto_max {
            return fail(
                "rto_initial",
                format!("{:?} is outside rto_min..=rto_max", self.rto_initial),
            );
        }
        if self.ack_every == 0 {
            return fail("ack_every", "must be at least 1".into());
        }
        if self.peer_timeout <= self.rto_min {
            return fail(
                "peer_timeout",
                format!("{:?} must exceed rto_min", self.peer_timeout),
            );
        }
        if self.dup_threshold == 0 {
            return fail("dup_threshold", "must be at least 1".into());
        }
        if self.credit_horizon.is_zero() {
            return fail("credit_horizon", "must be positive".into());
        }
        Ok(())
    }
}
