//! The helper thread: services a reliable module's fabric while the
//! application is away, so that a rank that computes for a long time between
//! calls still acknowledges, retransmits, grants credit and keeps its peers'
//! failure clocks honest.
//!
//! # Threading contract
//!
//! * The application's own calls (`progress`, `send`, …) take the module's
//!   lock for their duration; the helper takes it only after the
//!   application has not called `progress` for [`AWAY_AFTER`], and only for
//!   one pass of the drive loop. The application's fast path therefore
//!   pays an uncontended lock and one relaxed counter store per `progress`,
//!   no system call.
//! * The helper never runs a callback. What arrives in order while the
//!   application is away waits in its receive buffer (within the pool's
//!   reserve rules), and acknowledged or failed sends wait in the queue of
//!   notices; the application's next `progress` reports them in order.
//! * While the application is active the helper sleeps on a timer
//!   ([`AWAY_AFTER`]); while it is away, the helper sleeps on the module's
//!   sockets (a completion channel) until a datagram or a timer is due. It
//!   never spins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use udbtl_fabric::{CompletionChannel, Context, Waker};

use super::Engine;

/// How long the application may go without calling `progress` before the
/// helper services the fabric: far above the gap between two progress calls
/// of a communicating rank, far below any retransmission backoff or peer
/// timeout.
pub(super) const AWAY_AFTER: Duration = Duration::from_millis(10);

/// A running helper thread, stopped and joined when dropped.
#[derive(Debug)]
pub(super) struct Helper {
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    waker: Waker,
}

impl Helper {
    /// Starts a helper for `engine`, which waits on `channel` while the
    /// application is away. `activity` is the counter the application's
    /// progress bumps.
    pub(super) fn start<C: Context + 'static>(
        engine: Arc<Mutex<Engine<C>>>,
        activity: Arc<AtomicU64>,
        channel: CompletionChannel,
        idle_wait: Duration,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let waker = channel.waker();
        let thread = std::thread::Builder::new()
            .name("udbtl-progress".into())
            .spawn({
                let stop = stop.clone();
                move || run(&engine, &activity, &channel, &stop, idle_wait)
            })?;
        Ok(Self {
            thread: Some(thread),
            stop,
            waker,
        })
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            if thread.join().is_err() {
                tracing::error!("the progress helper thread panicked");
            }
        }
    }
}

/// The helper's loop. `idle_wait` bounds a wait on the sockets when no
/// timer is armed, so that the engine's own record of when it last ran stays
/// fresh (a long gap would read as the process having been stopped).
fn run<C: Context>(
    engine: &Mutex<Engine<C>>,
    activity: &AtomicU64,
    channel: &CompletionChannel,
    stop: &AtomicBool,
    idle_wait: Duration,
) {
    let mut away = false;
    while !stop.load(Ordering::Acquire) {
        let seen = activity.load(Ordering::Relaxed);
        if away {
            let timeout = {
                let mut engine = engine.lock();
                let now = engine.ctx.now();
                engine
                    .next_deadline()
                    .map_or(idle_wait, |at| at.saturating_sub(now).min(idle_wait))
            };
            if let Err(err) = channel.wait(Some(timeout)) {
                tracing::warn!(%err, "waiting on the completion channel failed");
                std::thread::park_timeout(AWAY_AFTER);
            }
        } else {
            std::thread::park_timeout(AWAY_AFTER);
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        if activity.load(Ordering::Relaxed) != seen {
            // The application progressed meanwhile: it services itself.
            away = false;
            continue;
        }
        engine.lock().progress(false);
        away = true;
    }
}
