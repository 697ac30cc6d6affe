//! Completion channels: what a thread blocks on until a completion queue may
//! have completions, the counterpart of verbs' `ibv_comp_channel`.
//!
//! A [`CompletionChannel`] owns an epoll instance and an eventfd. The
//! provider registers with the epoll instance, for readability, the socket of
//! every queue pair that receives into the channel's completion queue, and
//! removes it again when the queue pair is destroyed. The eventfd is what a
//! [`Waker`] writes to.
//!
//! The channel holds no reference to the context that made it: it can be
//! moved to another thread and waited on while that context is used, without
//! the context's lock. Nor does it hold any socket: epoll keeps watching a
//! socket only while the socket is open, so a queue pair destroyed (or a
//! context dropped) simply stops being watched and can never make a wait
//! fail or refer to a closed or reused descriptor.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, Timespec, epoll, eventfd};

/// The epoll token of the waker's eventfd; sockets carry [`SOCKET_TOKEN`].
const WAKER_TOKEN: u64 = 0;
const SOCKET_TOKEN: u64 = 1;
/// Longest single `epoll_wait`: older kernels refuse timeouts above
/// `c_int::MAX` milliseconds, so longer waits are taken in slices.
const MAX_SLICE: Duration = Duration::from_secs(3600);

/// What [`CompletionChannel::wait`] returned for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// A queue pair receiving into the channel's completion queue has a
    /// datagram waiting: polling the queue may yield a completion. The
    /// readiness may be spurious (another thread polled first, or what is
    /// waiting is dropped by the poll); poll to find out.
    Ready,
    /// The timeout passed first.
    TimedOut,
    /// A [`Waker`] of this channel was woken. The wakeup is consumed.
    Woken,
}

#[derive(Debug)]
struct Inner {
    epoll: OwnedFd,
    event: OwnedFd,
}

/// A completion channel of one completion queue: blocks a thread until the
/// queue may have completions, a timeout passes, or a [`Waker`] is woken.
///
/// Made by [`Context::completion_channel`](crate::Context::completion_channel).
/// It is `Send + Sync` and independent of the context: it may be waited on
/// from any thread while another uses the context, and it outlives the
/// context (once the context is dropped its queue pairs are gone and a wait
/// ends only by timeout or waker).
#[derive(Debug)]
pub struct CompletionChannel {
    inner: Arc<Inner>,
}

/// Wakes a [`CompletionChannel`]'s wait from any thread. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Waker {
    inner: Arc<Inner>,
}

/// A provider's handle on a channel: registers and removes sockets while the
/// channel lives, without keeping it alive.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    inner: Weak<Inner>,
}

fn retry<T>(mut call: impl FnMut() -> rustix::io::Result<T>) -> io::Result<T> {
    loop {
        match call() {
            Err(rustix::io::Errno::INTR) => {}
            other => return other.map_err(io::Error::from),
        }
    }
}

impl CompletionChannel {
    /// A channel watching nothing yet, and its registration for the
    /// provider.
    pub(crate) fn new() -> io::Result<(Self, Registration)> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let event = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(
            &epoll,
            &event,
            epoll::EventData::new_u64(WAKER_TOKEN),
            epoll::EventFlags::IN,
        )?;
        let inner = Arc::new(Inner { epoll, event });
        let registration = Registration {
            inner: Arc::downgrade(&inner),
        };
        Ok((Self { inner }, registration))
    }

    /// Blocks until a datagram is waiting for a queue pair that receives
    /// into this channel's completion queue ([`Wakeup::Ready`]), `timeout`
    /// passes ([`Wakeup::TimedOut`]; `None` waits forever, zero only looks),
    /// or a [`Waker`] was woken since the last wait that returned
    /// [`Wakeup::Woken`].
    ///
    /// Readiness is level-triggered: while a datagram is left unread, every
    /// wait returns `Ready` at once. Only datagrams still in the kernel
    /// count; completions already queued in the completion queue (send
    /// completions, or receives a poll pulled in but did not return) do not,
    /// so poll the queue empty before waiting. When a wakeup and readiness
    /// coincide, `Woken` is returned and the readiness is seen by the next
    /// wait. Interrupted system calls are retried.
    ///
    /// # Errors
    /// `epoll_wait` or reading the eventfd failed.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Wakeup> {
        // `None` waits forever, as does a timeout too long to represent.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut events = [MaybeUninit::<epoll::Event>::uninit(); 8];
        loop {
            let timespec = deadline.map(|deadline| {
                let slice = deadline
                    .saturating_duration_since(Instant::now())
                    .min(MAX_SLICE);
                Timespec::try_from(slice).unwrap_or(Timespec {
                    tv_sec: MAX_SLICE.as_secs().try_into().unwrap_or(i64::MAX),
                    tv_nsec: 0,
                })
            });
            let (ready, _) = match epoll::wait(&self.inner.epoll, &mut events, timespec.as_ref()) {
                Err(rustix::io::Errno::INTR) => continue,
                other => other?,
            };
            if ready.iter().any(|e| e.data.u64() == WAKER_TOKEN) && self.consume_wakeup()? {
                return Ok(Wakeup::Woken);
            }
            if ready.iter().any(|e| e.data.u64() == SOCKET_TOKEN) {
                return Ok(Wakeup::Ready);
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Ok(Wakeup::TimedOut);
            }
        }
    }

    /// Reads the eventfd's counter to zero; `false` when another waiter
    /// consumed it first.
    fn consume_wakeup(&self) -> io::Result<bool> {
        let mut count = [0u8; 8];
        match retry(|| rustix::io::read(&self.inner.event, &mut count)) {
            Ok(_) => Ok(true),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// A waker for this channel.
    pub fn waker(&self) -> Waker {
        Waker {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl Waker {
    /// Makes a wait in progress on the channel, or else the next one, return
    /// [`Wakeup::Woken`]. Wakes that happen before that wait returns are
    /// folded into one.
    pub fn wake(&self) {
        // A full counter (EAGAIN) already means "woken"; nothing else can
        // fail for a valid eventfd.
        let _ = retry(|| rustix::io::write(&self.inner.event, &1u64.to_ne_bytes()));
    }
}

impl Registration {
    /// `false` once the channel and all its wakers are dropped.
    pub(crate) fn is_live(&self) -> bool {
        self.inner.strong_count() > 0
    }

    /// Watches `socket` for readability, if the channel still lives.
    pub(crate) fn add(&self, socket: BorrowedFd<'_>) -> io::Result<()> {
        let Some(inner) = self.inner.upgrade() else {
            return Ok(());
        };
        retry(|| {
            epoll::add(
                &inner.epoll,
                socket,
                epoll::EventData::new_u64(SOCKET_TOKEN),
                epoll::EventFlags::IN,
            )
        })
    }

    /// Stops watching `socket`. Harmless if it was not watched.
    pub(crate) fn remove(&self, socket: BorrowedFd<'_>) {
        if let Some(inner) = self.inner.upgrade() {
            let _ = retry(|| epoll::delete(&inner.epoll, socket));
        }
    }
}
