//! The helper thread: services a reliable module's fabric while the
//! application is away, so that a rank that computes for a long time between
//! calls still acknowledges, retransmits, grants credit and keeps its peers'
//! failure clocks honest.
//!
//! # Threading contract
//!
//! * The application's own calls (`progress`, `send`, …) take the module's
//!   lock for their duration; the helper takes it only after the
//!   application has not called `progress` for a tenth of the peer timeout
//!   (at most [`AWAY_AFTER`]), and only for one pass of the drive loop. The application's fast path therefore
//!   pays an uncontended lock and one relaxed counter store per `progress`,
//!   no system call.
//! * The helper never runs a callback. What arrives in order while the
//!   application is away waits in its receive buffer (within the pool's
//!   reserve rules), and acknowledged or failed sends wait in the queue of
//!   notices; the application's next `progress` reports them in order.
//! * While the application is active the helper sleeps on a timer; while
//!   it is away, the helper sleeps on the module's
//!   sockets (a completion channel) until a datagram or a timer is due. It
//!   never spins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use udbtl_fabric::{CompletionChannel, Context, Waker};

use super::Engine;

/// Longest the application may go without calling `progress` before the
/// helper services the fabric (shorter for short peer timeouts, see
/// [`away_after`]): far above the gap between two progress calls of a
/// communicating rank, well below the peer timeout. Not shorter: on a VM
/// every timer wakeup of the helper disturbs a busy-polling rank on the same
/// CPU (at 10 ms, a measured 8 % on 8-byte ping-pong latency; at 200 ms,
/// within noise).
pub(super) const AWAY_AFTER: Duration = Duration::from_millis(200);

/// How long the application may be away before the helper steps in, for a
/// given peer timeout: a tenth of it, at most [`AWAY_AFTER`].
pub(super) fn away_after(peer_timeout: Duration) -> Duration {
    (peer_timeout / 10).clamp(Duration::from_millis(1), AWAY_AFTER)
}

/// A running helper thread, stopped and joined when dropped.
#[derive(Debug)]
pub(super) struct Helper {
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// What the module and its helper share besides the engine.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    /// The waker of the channel the helper is blocked on, if it is.
    waker: Mutex<Option<Waker>>,
}

impl Helper {
    /// Starts a helper for `engine`. `activity` is the counter the
    /// application's progress bumps.
    pub(super) fn start<C: Context + 'static>(
        engine: Arc<Mutex<Engine<C>>>,
        activity: Arc<AtomicU64>,
        peer_timeout: Duration,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let thread = std::thread::Builder::new()
            .name("udbtl-progress".into())
            .spawn({
                let shared = shared.clone();
                move || run(&engine, &activity, &shared, peer_timeout)
            })?;
        Ok(Self {
            thread: Some(thread),
            shared,
        })
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(waker) = self.shared.waker.lock().take() {
            waker.wake();
        }
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            if thread.join().is_err() {
                tracing::error!("the progress helper thread panicked");
            }
        }
    }
}

/// The helper's loop.
///
/// The completion channel exists only while the application is away: a
/// socket registered with an epoll instance makes every datagram it
/// receives run the kernel's epoll callback, which the busy-polling
/// application should not pay for.
fn run<C: Context>(
    engine: &Mutex<Engine<C>>,
    activity: &AtomicU64,
    shared: &Shared,
    peer_timeout: Duration,
) {
    let interval = away_after(peer_timeout);
    // A wait on the sockets with no timer armed still ends this often, so
    // that the engine's record of when it last ran stays fresh (a long gap
    // would read as the process having been stopped).
    let idle_wait = peer_timeout / 4;
    let mut channel: Option<CompletionChannel> = None;
    while !shared.stop.load(Ordering::Acquire) {
        let seen = activity.load(Ordering::Relaxed);
        match &channel {
            Some(channel) => {
                let timeout = {
                    let mut engine = engine.lock();
                    let now = engine.ctx.now();
                    engine
                        .next_deadline()
                        .map_or(idle_wait, |at| at.saturating_sub(now).min(idle_wait))
                };
                if let Err(err) = channel.wait(Some(timeout)) {
                    tracing::warn!(%err, "waiting on the completion channel failed");
                    std::thread::park_timeout(interval);
                }
            }
            None => std::thread::park_timeout(interval),
        }
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        if activity.load(Ordering::Relaxed) != seen {
            // The application progressed meanwhile: it services itself.
            *shared.waker.lock() = None;
            channel = None;
            continue;
        }
        let mut engine = engine.lock();
        engine.progress(false);
        if channel.is_none() {
            let cq = engine.cq;
            match engine.ctx.completion_channel(cq) {
                Ok(Some(made)) => {
                    *shared.waker.lock() = Some(made.waker());
                    channel = Some(made);
                }
                Ok(None) => {}
                Err(err) => tracing::warn!(%err, "could not make a completion channel"),
            }
        }
    }
}
