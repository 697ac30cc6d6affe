//! Cheap idle progress: a module that has been idle for a while is polled on
//! one progress call in [`STRIDE`], not on every one.
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
//! `STRIDE` through; every other call costs one atomic increment. Anything a
//! poll finds, and any send through the module, opens it again at once. A
//! busy module is therefore polled on every call, and a quiet one hears a
//! peer's first datagram at most `STRIDE - 1` progress calls late; those
//! skipped calls cost nanoseconds each. Timers (delayed acknowledgements,
//! keepalives) fire at the next poll that gets through, so at most the same
//! number of calls late.

use std::sync::atomic::{AtomicU32, Ordering};

use udbtl_btl::Polled;

/// Idle polls in a row before the gate quiets. Long enough that a
/// ping-pong's wait for its reply (a few microseconds of polls that find
/// nothing) never quiets a module that has data in flight anyway, and short
/// enough that a module idle for a fraction of a millisecond stops taxing
/// the progress loop.
pub const QUIET_AFTER: u32 = 256;

/// While quiet, one progress call in this many polls the module.
pub const STRIDE: u32 = 64;

/// Decides which progress calls poll a module. Shared by every thread that
/// calls progress: relaxed atomics, since a late or early poll is harmless.
#[derive(Debug, Default)]
pub struct IdleGate {
    /// Polls in a row that found the module idle (saturating).
    idle_polls: AtomicU32,
    /// Calls seen while quiet.
    quiet_calls: AtomicU32,
}

impl IdleGate {
    /// Whether this progress call should poll the module.
    pub fn should_poll(&self) -> bool {
        if self.idle_polls.load(Ordering::Relaxed) < QUIET_AFTER {
            return true;
        }
        self.quiet_calls.fetch_add(1, Ordering::Relaxed) % STRIDE == 0
    }

    /// Notes what a poll found.
    pub fn record(&self, polled: Polled) {
        if polled.idle {
            let idle = self.idle_polls.load(Ordering::Relaxed);
            if idle < QUIET_AFTER {
                self.idle_polls.store(idle + 1, Ordering::Relaxed);
            }
        } else {
            self.wake();
        }
    }

    /// Opens the gate: the module has work (a send, an arrival).
    pub fn wake(&self) {
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

    fn polls_in(gate: &IdleGate, calls: u32) -> u32 {
        (0..calls).filter(|_| gate.should_poll()).count() as u32
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
    fn idle_polls_below_the_threshold_keep_polling_every_call() {
        let gate = IdleGate::default();
        for _ in 0..QUIET_AFTER - 1 {
            assert!(gate.should_poll());
            gate.record(IDLE);
        }
        assert_eq!(polls_in(&gate, 1000), 1000);
    }

    #[test]
    fn a_quiet_module_is_polled_once_per_stride() {
        let gate = IdleGate::default();
        for _ in 0..QUIET_AFTER {
            gate.record(IDLE);
        }
        assert_eq!(polls_in(&gate, STRIDE * 100), 100);
    }

    #[test]
    fn an_arrival_or_a_send_opens_a_quiet_gate_at_once() {
        let gate = IdleGate::default();
        for _ in 0..QUIET_AFTER {
            gate.record(IDLE);
        }
        gate.record(BUSY);
        assert_eq!(polls_in(&gate, 100), 100);
        for _ in 0..QUIET_AFTER {
            gate.record(IDLE);
        }
        gate.wake();
        assert_eq!(polls_in(&gate, 100), 100);
    }
}
