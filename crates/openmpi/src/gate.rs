//! Cheap idle progress: a module that has been idle for a while is polled on
//! one progress call in a stride that grows while it stays idle, not on
//! every one.
//!
//! Open MPI calls every BTL's progress from every `opal_progress`, and once
//! a peer is reached through udbtl, bml registers udbtl's progress at high
//! priority. A poll reads the fabric, which on UDP is a system call, so an
//! idle udbtl would tax every progress loop of the process, shared-memory
//! traffic on the node included. Open MPI's tcp BTL pays for its event loop
//! only every so many calls too.
//!
//! The rule: [`QUIET_AFTER`] polls in a row that found the module idle
//! (nothing arrived, no event waits, no descriptor is held, so nothing is in
//! flight: [`Polled::idle`]) quiet the gate. A quiet gate lets one call in
//! `stride` through, and every poll that still finds the module idle doubles
//! the stride, up to [`MAX_STRIDE`]. Anything a poll finds, and any send
//! through the module, opens the gate at once. A busy module is therefore
//! polled on every call; one idle for long costs a load and a store per
//! call, and hears a peer's first datagram at most `MAX_STRIDE - 1` progress
//! calls late (a few microseconds when the loop only polls). Timers (delayed
//! acknowledgements, keepalives) fire at the next poll that gets through.
//!
//! The counters are relaxed loads and stores, not read-modify-writes: two
//! threads racing on them only move a poll a little, which is harmless, and
//! a skipped call then costs no locked instruction.

use std::sync::atomic::{AtomicU32, Ordering};

use udbtl_btl::Polled;

/// Idle polls in a row before the gate quiets. Long enough that a wait of a
/// few microseconds (a ping-pong's reply, which comes with data in flight
/// anyway) never quiets it, short enough that a module idle for a fraction
/// of a millisecond stops taxing the progress loop.
pub const QUIET_AFTER: u32 = 256;

/// The widest stride: while idle for long, one progress call in this many
/// polls the module.
pub const MAX_STRIDE: u32 = 1024;

/// Decides which progress calls poll a module. Shared by every thread that
/// calls progress.
#[derive(Debug)]
pub struct IdleGate {
    /// Polls in a row that found the module idle (saturating).
    idle_polls: AtomicU32,
    /// One call in this many polls; 1 while the gate is open.
    stride: AtomicU32,
    /// Calls left before the next poll while quiet.
    countdown: AtomicU32,
}

impl Default for IdleGate {
    fn default() -> Self {
        Self {
            idle_polls: AtomicU32::new(0),
            stride: AtomicU32::new(1),
            countdown: AtomicU32::new(0),
        }
    }
}

impl IdleGate {
    /// Whether this progress call should poll the module.
    pub fn should_poll(&self) -> bool {
        if self.stride.load(Ordering::Relaxed) <= 1 {
            return true;
        }
        let left = self.countdown.load(Ordering::Relaxed);
        if left > 1 {
            self.countdown.store(left - 1, Ordering::Relaxed);
            return false;
        }
        self.countdown
            .store(self.stride.load(Ordering::Relaxed), Ordering::Relaxed);
        true
    }

    /// Notes what a poll found.
    pub fn record(&self, polled: Polled) {
        if !polled.idle {
            self.wake();
            return;
        }
        let idle = self.idle_polls.load(Ordering::Relaxed);
        if idle < QUIET_AFTER {
            self.idle_polls.store(idle + 1, Ordering::Relaxed);
            return;
        }
        let stride = self.stride.load(Ordering::Relaxed);
        if stride < MAX_STRIDE {
            self.stride
                .store((stride * 2).min(MAX_STRIDE), Ordering::Relaxed);
        }
    }

    /// Opens the gate: the module has work (a send, an arrival).
    pub fn wake(&self) {
        if self.stride.load(Ordering::Relaxed) != 1 {
            self.stride.store(1, Ordering::Relaxed);
        }
        if self.idle_polls.load(Ordering::Relaxed) != 0 {
            self.idle_polls.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Polled = Polled {
        handled: 0,
        idle: true,
    };
    const BUSY: Polled = Polled {
        handled: 1,
        idle: false,
    };

    /// Runs `calls` progress calls on an idle module; returns the polls.
    fn idle_calls(gate: &IdleGate, calls: u32) -> u32 {
        let mut polls = 0;
        for _ in 0..calls {
            if gate.should_poll() {
                polls += 1;
                gate.record(IDLE);
            }
        }
        polls
    }

    #[test]
    fn a_busy_module_is_polled_on_every_call() {
        let gate = IdleGate::default();
        for _ in 0..10_000 {
            assert!(gate.should_poll());
            gate.record(BUSY);
        }
    }

    #[test]
    fn a_short_idle_spell_keeps_polling_every_call() {
        let gate = IdleGate::default();
        assert_eq!(idle_calls(&gate, QUIET_AFTER), QUIET_AFTER);
    }

    #[test]
    fn a_long_idle_spell_polls_once_per_widest_stride() {
        let gate = IdleGate::default();
        idle_calls(&gate, QUIET_AFTER + 4 * MAX_STRIDE);
        assert_eq!(idle_calls(&gate, 100 * MAX_STRIDE), 100);
    }

    #[test]
    fn the_stride_widens_step_by_step() {
        let gate = IdleGate::default();
        idle_calls(&gate, QUIET_AFTER);
        // Calls between polls from here on: never shrinking, doubling up to
        // the widest stride.
        let mut gaps = Vec::new();
        let mut since = 0;
        for _ in 0..8 * MAX_STRIDE {
            since += 1;
            if gate.should_poll() {
                gate.record(IDLE);
                gaps.push(since);
                since = 0;
            }
        }
        assert!(gaps.windows(2).all(|w| w[0] <= w[1]), "{gaps:?}");
        assert!(gaps.windows(2).all(|w| w[1] <= 2 * w[0].max(1)), "{gaps:?}");
        assert_eq!(gaps.last().copied(), Some(MAX_STRIDE), "{gaps:?}");
    }

    #[test]
    fn an_arrival_or_a_send_opens_a_quiet_gate_at_once() {
        let gate = IdleGate::default();
        idle_calls(&gate, QUIET_AFTER + 4 * MAX_STRIDE);
        gate.record(BUSY);
        assert!((0..100).all(|_| gate.should_poll()));
        idle_calls(&gate, QUIET_AFTER + 4 * MAX_STRIDE);
        gate.wake();
        assert!((0..100).all(|_| gate.should_poll()));
    }
}
