//! Each peer's table of deadlines ([`TimerTable`]), one per [`Timer`].

use crate::time::Instant;

/// A timer of a peer that is armed and stopped explicitly. The failure
/// deadline, the keepalive and the end of lingering are not here: they
/// follow from the peer's state (`Peer::next_deadline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// Retransmission timeout; while data waits and nothing can fly, the
    /// zero-window probe.
    Rto = 0,
    /// When the earliest datagram that RACK suspects becomes lost.
    Loss = 1,
    /// The tail-loss probe: with data in flight and nothing acknowledged
    /// for two round trips, the newest datagram goes again and asks for an
    /// acknowledgement, which lets RACK see a lost tail.
    Pto = 2,
    /// A delayed acknowledgement is due.
    Ack = 3,
}

impl Timer {
    /// Number of timers.
    const COUNT: usize = 4;
}

/// One deadline per [`Timer`], `None` while it is stopped: a fixed array,
/// never allocated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct TimerTable {
    deadlines: [Option<Instant>; Timer::COUNT],
}

impl TimerTable {
    /// Every timer stopped.
    pub(super) const fn new() -> Self {
        Self {
            deadlines: [None; Timer::COUNT],
        }
    }

    /// Arms `timer` for `at`, replacing any earlier setting.
    pub(super) fn set(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer as usize] = Some(at);
    }

    /// Stops `timer`.
    pub(super) fn stop(&mut self, timer: Timer) {
        self.deadlines[timer as usize] = None;
    }

    /// Stops every timer.
    pub(super) fn stop_all(&mut self) {
        self.deadlines = [None; Timer::COUNT];
    }

    /// `timer` is armed.
    pub(super) const fn is_set(&self, timer: Timer) -> bool {
        self.deadlines[timer as usize].is_some()
    }

    /// `timer` is armed and due at `now`.
    pub(super) fn expired(&self, timer: Timer, now: Instant) -> bool {
        self.deadlines[timer as usize].is_some_and(|at| at <= now)
    }

    /// The earliest armed deadline. Runs on every send and receive: plain
    /// comparisons, no iterator.
    pub(super) const fn next_timeout(&self) -> Option<Instant> {
        let [rto, loss, pto, ack] = self.deadlines;
        earliest(earliest(rto, ack), earliest(loss, pto))
    }
}

/// The earlier of two optional deadlines. Runs on every send and receive:
/// plain comparisons, no iterator.
pub(super) const fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.as_nanos() < a.as_nanos() { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}
