//! Waiting inside the BTL (for a message's pieces, for a drain) with a
//! deadline on the fabric's clock.

use std::time::Duration;

/// A wait on the fabric's clock that also ends when that clock stands still
/// while nothing happens: on a simulated fabric only its driver moves time,
/// and a caller waiting inside the BTL would otherwise spin for ever.
pub(super) struct Wait {
    end: Duration,
    last: Duration,
    idle: u32,
}

impl Wait {
    /// Idle progress calls with a clock that did not move before giving up.
    const STILL_CLOCK_POLLS: u32 = 100_000;

    pub(super) fn new(now: Duration, limit: Duration) -> Self {
        Self {
            end: now.saturating_add(limit),
            last: now,
            idle: 0,
        }
    }

    /// Whether the wait is over, after a progress call that handled
    /// `handled` completions at `now`.
    pub(super) fn over(&mut self, now: Duration, handled: usize) -> bool {
        if handled > 0 || now != self.last {
            self.idle = 0;
            self.last = now;
        } else {
            self.idle += 1;
        }
        now >= self.end || self.idle >= Self::STILL_CLOCK_POLLS
    }
}
