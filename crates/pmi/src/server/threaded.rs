//! The threaded [`Server`]: one thread per rank connection around a shared
//! [`ServerCore`], the [`ServerEvent`]s it sends the launcher and the
//! [`ServerStats`] it counts. Serving local ranks over a stream
//! ([`Server::serve`]) is here; the TCP listeners of port mode are in
//! [`port`](super::port).

use std::io::{self, BufReader, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tracing::{debug, trace, warn};

use super::core::barrier_out;
use super::{Action, KvsLimits, ServerCore, ServerError};
use crate::mapping::ProcessMapping;
use crate::wire::{self, Message, ReadError};

/// What the threaded [`Server`] tells the launcher.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServerEvent {
    /// A rank sent `abort`: kill the job and exit with `code`.
    Aborted {
        /// The rank.
        rank: u32,
        /// Its exit code.
        code: i32,
        /// Its message.
        message: String,
    },
    /// A port-mode connection completed its handshake and is now rank
    /// `rank`'s (sent before any other event of that connection). Local
    /// ranks served with [`Server::serve`] get none: they are connected
    /// from the start.
    Connected {
        /// The rank.
        rank: u32,
    },
    /// A rank finalized.
    Finalized {
        /// The rank.
        rank: u32,
    },
    /// A rank's connection ended before it finalized (or aborted): it died
    /// or closed its PMI socket. `error` is the I/O error, if any.
    Disconnected {
        /// The rank.
        rank: u32,
        /// The read or write error; `None` for a clean end of stream.
        error: Option<io::Error>,
    },
    /// A connection sent something that is not PMI-1 or broke the protocol;
    /// it was closed. `rank` is `None` for a port-mode connection that had
    /// not completed its handshake.
    ProtocolError {
        /// The rank, when known.
        rank: Option<u32>,
        /// What went wrong.
        detail: String,
    },
    /// The last rank entered a barrier, which is now released. Sent only
    /// after [`Server::report_barriers`], once per barrier, by the thread of
    /// the rank that completed it, just before that thread wakes the others.
    BarrierReleased {
        /// How many barriers have completed, this one included (1 for the
        /// first), as [`ServerCore::barrier_epoch`].
        epoch: u64,
    },
}

/// The threaded PMI-1 server: one thread per rank connection around a
/// shared [`ServerCore`]. Cloning gives another handle to the same server.
#[derive(Debug, Clone)]
pub struct Server {
    pub(super) shared: Arc<Shared>,
}

/// What the handles of a [`Server`] and its threads share.
#[derive(Debug)]
pub(super) struct Shared {
    core: Mutex<Guarded>,
    released: Condvar,
    events: Sender<ServerEvent>,
    /// Whether to send [`ServerEvent::BarrierReleased`].
    barrier_events: AtomicBool,
    pub(super) counters: Counters,
}

/// The atomics behind [`ServerStats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) connections_accepted: AtomicU64,
    pub(super) accept_errors: AtomicU64,
    pub(super) connections_refused_over_cap: AtomicU64,
    pub(super) handshakes_in_progress: AtomicU64,
    pub(super) connections_waiting: AtomicU64,
    pub(super) handshakes_completed: AtomicU64,
    pub(super) handshake_failures: AtomicU64,
    pub(super) claims_refused: AtomicU64,
    pub(super) protocol_errors: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What the threaded [`Server`] has seen so far ([`Server::stats`]).
///
/// Of the port-mode connections accepted, each is eventually counted in
/// exactly one of `connections_refused_over_cap`, `handshakes_completed`,
/// `handshake_failures` and `claims_refused`; until then it is in
/// `connections_waiting` or `handshakes_in_progress`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStats {
    /// TCP connections accepted by the port-mode listeners (the server's own
    /// wake-up connection at shutdown excluded).
    pub connections_accepted: u64,
    /// Failed `accept(2)` calls: out of descriptors, or (`ECONNABORTED`) a
    /// connection reset by its peer before it could be accepted.
    pub accept_errors: u64,
    /// Connections closed at once because
    /// [`PortOptions::with_max_handshakes_per_source`] others from their
    /// address were in their handshake and as many more were waiting (or
    /// no thread could be started).
    ///
    /// [`PortOptions::with_max_handshakes_per_source`]: super::PortOptions::with_max_handshakes_per_source
    pub connections_refused_over_cap: u64,
    /// Connections accepted that wait for a handshake slot of their
    /// address, right now.
    pub connections_waiting: u64,
    /// Connections in their handshake right now.
    pub handshakes_in_progress: u64,
    /// Handshakes that gave a connection its rank.
    pub handshakes_completed: u64,
    /// Handshakes that failed: closed early, timed out, oversized or
    /// malformed line, not an `initack`, bad `pmiid`, missing or wrong
    /// proof.
    pub handshake_failures: u64,
    /// Handshakes refused because their rank already had a connection (with
    /// or without a valid proof).
    pub claims_refused: u64,
    /// Established rank connections (socketpair or port mode) closed for
    /// breaking the protocol, a key-value space quota included.
    pub protocol_errors: u64,
}

/// The state behind the lock of [`Shared`].
#[derive(Debug)]
pub(super) struct Guarded {
    pub(super) core: ServerCore,
    pub(super) shutdown: bool,
    /// The port-mode listeners' addresses, to wake their accept threads at
    /// shutdown.
    pub(super) listeners: Vec<SocketAddr>,
}

impl Server {
    /// A server for ranks `0..size`; events go to `events` (a dropped
    /// receiver is ignored).
    ///
    /// # Errors
    ///
    /// As [`ServerCore::new`].
    pub fn new(
        size: u32,
        kvsname: impl Into<String>,
        events: Sender<ServerEvent>,
    ) -> Result<Self, ServerError> {
        let core = ServerCore::new(size, kvsname)?;
        let guarded = Guarded {
            core,
            shutdown: false,
            listeners: Vec::new(),
        };
        let shared = Shared {
            core: Mutex::new(guarded),
            released: Condvar::new(),
            events,
            barrier_events: AtomicBool::new(false),
            counters: Counters::default(),
        };
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// Serves rank `rank` over `stream`, a connected stream such as one end
    /// of `UnixStream::pair()` whose other end the child inherits as
    /// `PMI_FD`, on a new thread that ends when the rank's stream ends (or
    /// fails, or breaks the protocol).
    ///
    /// # Errors
    ///
    /// [`ServerError::RankOutOfRange`], [`ServerError::AlreadyConnected`],
    /// [`ServerError::Spawn`].
    pub fn serve<S>(&self, stream: S, rank: u32) -> Result<JoinHandle<()>, ServerError>
    where
        S: Read + Write + Send + 'static,
    {
        self.shared.lock().core.attach(rank)?;
        let shared = Arc::clone(&self.shared);
        let name = format!("pmi-rank-{rank}");
        thread::Builder::new()
            .name(name.clone())
            .spawn(move || shared.run(&mut BufReader::new(stream), rank))
            .map_err(|source| {
                self.shared.lock().core.detach(rank);
                ServerError::Spawn { name, source }
            })
    }

    /// The counts of connections, handshakes and protocol errors so far.
    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ServerStats {
            connections_accepted: get(&c.connections_accepted),
            accept_errors: get(&c.accept_errors),
            connections_refused_over_cap: get(&c.connections_refused_over_cap),
            connections_waiting: get(&c.connections_waiting),
            handshakes_in_progress: get(&c.handshakes_in_progress),
            handshakes_completed: get(&c.handshakes_completed),
            handshake_failures: get(&c.handshake_failures),
            claims_refused: get(&c.claims_refused),
            protocol_errors: get(&c.protocol_errors),
        }
    }

    /// Sets how much of the key-value space each rank may hold (default
    /// [`KvsLimits::DEFAULT`]); see [`ServerCore::set_kvs_limits`].
    pub fn set_kvs_limits(&self, limits: KvsLimits) {
        self.shared.lock().core.set_kvs_limits(limits);
    }

    /// From now on, also report every barrier release as
    /// [`ServerEvent::BarrierReleased`]. Off by default, so that a launcher
    /// that does not care sees only the events that need action. Call it
    /// before serving any rank to be sure to see the first barrier.
    pub fn report_barriers(&self) {
        self.shared.barrier_events.store(true, Ordering::Relaxed);
    }

    /// See [`ServerCore::set_process_mapping`]. Call it before serving any
    /// rank.
    pub fn set_process_mapping(&self, mapping: ProcessMapping) {
        self.shared.lock().core.set_process_mapping(mapping);
    }

    /// Stops the server: ranks held in a barrier get `cmd=barrier_out rc=-1`
    /// and their threads end; accept threads end. Threads reading a rank's
    /// stream end when that stream does (when the launcher kills the rank).
    pub fn shutdown(&self) {
        let listeners = {
            let mut guarded = self.shared.lock();
            guarded.shutdown = true;
            std::mem::take(&mut guarded.listeners)
        };
        self.shared.released.notify_all();
        for addr in listeners {
            // Wake the accept loop, which checks `shutdown` after each accept.
            let addr = match addr.ip() {
                ip if !ip.is_unspecified() => addr,
                std::net::IpAddr::V4(_) => SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port())),
                std::net::IpAddr::V6(_) => SocketAddr::from((Ipv6Addr::LOCALHOST, addr.port())),
            };
            if let Err(e) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                warn!(%addr, error = %e, "could not wake the PMI accept thread");
            }
        }
    }
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Guarded> {
        // A panic while holding the lock cannot leave the core half-updated
        // in a way that matters more than stopping the whole job would.
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn event(&self, event: ServerEvent) {
        // The launcher may have stopped listening; nothing else to do then.
        let _ = self.events.send(event);
    }

    /// Serves one rank until its stream ends.
    pub(super) fn run<S: Read + Write>(&self, conn: &mut BufReader<S>, rank: u32) {
        let mut ended = false;
        let gone = |ended: bool, error: Option<io::Error>| {
            if !ended {
                debug!(rank, ?error, "PMI connection lost before finalize");
                self.event(ServerEvent::Disconnected { rank, error });
            }
        };
        loop {
            let (action, epoch) = match wire::read_message(conn) {
                Ok(Some(msg)) => {
                    let mut guarded = self.lock();
                    (
                        guarded.core.handle(rank, &msg),
                        guarded.core.barrier_epoch(),
                    )
                }
                Ok(None) => return gone(ended, None),
                Err(ReadError::Io(e)) => return gone(ended, Some(e)),
                Err(ReadError::Malformed(e)) => {
                    (self.lock().core.handle_malformed(Some(rank), &e), 0)
                }
            };
            let written = match action {
                Action::Reply(reply) => send(conn.get_mut(), &reply),
                Action::ReplyLater => match self.wait_release(epoch) {
                    Some(reply) => send(conn.get_mut(), &reply),
                    None => {
                        let reply = Message::new("barrier_out")
                            .with("rc", "-1")
                            .with("msg", "server_shutdown");
                        let _ = send(conn.get_mut(), &reply);
                        return;
                    }
                },
                Action::Release { reply, .. } => {
                    if self.barrier_events.load(Ordering::Relaxed) {
                        self.event(ServerEvent::BarrierReleased { epoch });
                    }
                    self.released.notify_all();
                    send(conn.get_mut(), &reply)
                }
                Action::Abort {
                    rank,
                    code,
                    message,
                } => {
                    ended = true;
                    self.event(ServerEvent::Aborted {
                        rank,
                        code,
                        message,
                    });
                    Ok(())
                }
                Action::Finalized { reply } => {
                    ended = true;
                    self.event(ServerEvent::Finalized { rank });
                    send(conn.get_mut(), &reply)
                }
                Action::Close { reply, detail } => {
                    bump(&self.counters.protocol_errors);
                    warn!(rank, detail, "PMI protocol error; closing the connection");
                    if let Some(reply) = reply {
                        let _ = send(conn.get_mut(), &reply);
                    }
                    self.event(ServerEvent::ProtocolError {
                        rank: Some(rank),
                        detail,
                    });
                    return;
                }
            };
            if let Err(e) = written {
                return gone(ended, Some(e));
            }
        }
    }

    /// Waits until the barrier entered at `epoch` is released; `None` on
    /// shutdown.
    fn wait_release(&self, epoch: u64) -> Option<Message> {
        let mut guarded = self.lock();
        loop {
            if guarded.core.barrier_epoch() != epoch {
                return Some(barrier_out());
            }
            if guarded.shutdown {
                return None;
            }
            guarded = self
                .released
                .wait(guarded)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Writes one message and flushes it.
pub(super) fn send<W: Write>(writer: &mut W, msg: &Message) -> io::Result<()> {
    let line = msg
        .to_line()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    trace!(reply = line.trim_end(), "PMI reply");
    writer.write_all(line.as_bytes())?;
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barrier_releases_are_reported_on_request() {
        use std::io::BufRead;
        use std::os::unix::net::UnixStream;
        use std::sync::mpsc;

        fn barrier(conn: &mut BufReader<UnixStream>) -> String {
            conn.get_mut().write_all(b"cmd=barrier_in\n").unwrap();
            let mut reply = String::new();
            conn.read_line(&mut reply).unwrap();
            reply
        }

        for report in [false, true] {
            let (tx, events) = mpsc::channel();
            let server = Server::new(2, "kvs_b", tx).unwrap();
            if report {
                server.report_barriers();
            }
            let [mut zero, mut one] = [0, 1].map(|rank| {
                let (ours, theirs) = UnixStream::pair().unwrap();
                ours.set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                server.serve(theirs, rank).unwrap();
                BufReader::new(ours)
            });
            for _ in 0..2 {
                let held = thread::spawn(move || (barrier(&mut one), one));
                assert_eq!(barrier(&mut zero), "cmd=barrier_out rc=0\n");
                let reply;
                (reply, one) = held.join().unwrap();
                assert_eq!(reply, "cmd=barrier_out rc=0\n");
            }
            let got: Vec<_> = events.try_iter().collect();
            if report {
                assert!(
                    matches!(
                        got[..],
                        [
                            ServerEvent::BarrierReleased { epoch: 1 },
                            ServerEvent::BarrierReleased { epoch: 2 }
                        ]
                    ),
                    "{got:?}"
                );
            } else {
                assert!(got.is_empty(), "{got:?}");
            }
        }
    }
}
