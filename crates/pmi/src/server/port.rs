//! Port mode (`PMI_PORT`): the TCP listeners of [`Server::listen_tcp_with`]
//! and its variants, the handshake of each connection under a deadline
//! (with the job secret's challenge when [`PortOptions::with_secret`] asks
//! for it), and the cap on connections in their handshake. See the [module
//! docs](super#port-mode).

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::handshake::challenge_message;
use super::threaded::{Shared, bump, send};
use super::{Handshake, Refusal, Server, ServerError, ServerEvent};
use crate::auth::{self, JobSecret};
use crate::sys;
use crate::wire::{self, Message, ReadError};

/// Default of [`PortOptions::with_handshake_timeout`]: how long a
/// port-mode connection may take, from its accept to the end of the
/// server's handshake replies.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of [`PortOptions::with_max_handshakes`]: how many port-mode
/// connections may be in their handshake at once, per listener.
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;

/// Default of [`PortOptions::with_max_handshakes_per_source`]: how many of
/// them may come from one address. A real node's ranks each finish their
/// handshake in milliseconds, so a few slots serve all of them in turn.
pub const DEFAULT_MAX_HANDSHAKES_PER_SOURCE: usize = 8;

/// How often the accept thread looks again while the handshake cap is
/// reached.
const CAP_POLL: Duration = Duration::from_millis(2);

/// How [`Server::listen_tcp_with`] serves port-mode connections. Build it
/// with [`PortOptions::new`] (or `default()`) and the `with_*` methods.
#[derive(Debug, Clone)]
pub struct PortOptions {
    secret: Option<JobSecret>,
    handshake_timeout: Duration,
    max_handshakes: usize,
    max_handshakes_per_source: usize,
}

impl Default for PortOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl PortOptions {
    /// No secret (the plain `initack` handshake), a handshake time of
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`] and at most [`DEFAULT_MAX_HANDSHAKES`]
    /// connections in their handshake at once, at most
    /// [`DEFAULT_MAX_HANDSHAKES_PER_SOURCE`] of them from one address.
    pub fn new() -> Self {
        Self {
            secret: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
        }
    }

    /// Requires every connection to prove it holds `secret` (see
    /// [authenticated port mode](super#authenticated-port-mode)).
    #[must_use]
    pub fn with_secret(mut self, secret: JobSecret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// How long a connection may take from its accept to the end of the
    /// handshake (a whole-handshake deadline, not a per-read timeout, so a
    /// peer that dribbles bytes is cut off too). Keep it above the client's
    /// [`CHALLENGE_TIMEOUT`](crate::client::CHALLENGE_TIMEOUT), so that a
    /// client holding a secret facing a server without one times out first
    /// and says so.
    #[must_use]
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// How many connections of this listener may be in their handshake at
    /// once (at least 1). While that many are, the listener accepts
    /// nothing: new connections wait in the kernel's listen queue, in the
    /// order they came, and none is closed, so a flood cannot win the race
    /// against a rank that connects later. The listener thus runs at most
    /// this many handshake threads plus one thread per connected rank.
    #[must_use]
    pub fn with_max_handshakes(mut self, max: usize) -> Self {
        self.max_handshakes = max.max(1);
        self
    }

    /// How many of those may come from one address (at least 1, at most
    /// the whole cap). One more from it waits, accepted but without a
    /// thread, until a slot of its address frees (as the ranks of a big
    /// node do when they start together); with as many waiting as the
    /// whole cap, one more is closed at once, counted in
    /// [`ServerStats::connections_refused_over_cap`] and reported (a real
    /// rank's client reconnects). One host holding idle connections thus
    /// leaves the other hosts' slots free.
    ///
    /// [`ServerStats::connections_refused_over_cap`]: super::ServerStats::connections_refused_over_cap
    #[must_use]
    pub fn with_max_handshakes_per_source(mut self, max: usize) -> Self {
        self.max_handshakes_per_source = max.max(1);
        self
    }

    /// Whether connections must prove they hold the job secret.
    pub fn requires_secret(&self) -> bool {
        self.secret.is_some()
    }
}

impl Server {
    /// Listens for port-mode connections with the default
    /// [`PortOptions`]: no secret, so the plain `initack` handshake as
    /// before, but with the default bounds on handshakes.
    ///
    /// Anyone who can connect can claim a rank that has not connected yet
    /// and then read and write the key-value space: use
    /// [`listen_tcp_authenticated`](Self::listen_tcp_authenticated) unless
    /// the address is reachable by trusted hosts only.
    ///
    /// # Errors
    ///
    /// As [`listen_tcp_with`](Self::listen_tcp_with).
    pub fn listen_tcp(
        &self,
        addr: impl ToSocketAddrs,
    ) -> Result<(u16, JoinHandle<()>), ServerError> {
        self.listen_tcp_with(addr, PortOptions::new())
    }

    /// Listens for port-mode connections whose clients must prove they hold
    /// `secret`, with the default bounds: [`listen_tcp_with`](Self::listen_tcp_with)
    /// and `PortOptions::new().with_secret(secret)`.
    ///
    /// # Errors
    ///
    /// As [`listen_tcp_with`](Self::listen_tcp_with).
    pub fn listen_tcp_authenticated(
        &self,
        addr: impl ToSocketAddrs,
        secret: JobSecret,
    ) -> Result<(u16, JoinHandle<()>), ServerError> {
        self.listen_tcp_with(addr, PortOptions::new().with_secret(secret))
    }

    /// Listens for port-mode connections (`PMI_PORT=<host>:<port>`,
    /// `PMI_ID=<rank>`) on `addr` and serves each on its own thread once its
    /// handshake (see the [module docs](super#port-mode)) names a rank that
    /// has no connection yet. Returns the bound port (useful with port 0)
    /// and the accept thread, which runs until [`shutdown`](Self::shutdown).
    ///
    /// Bind to the address the ranks are told to use, not to `0.0.0.0`.
    /// A connection that fails its handshake, is refused over the cap, or
    /// claims a rank already claimed is closed, counted in
    /// [`stats`](Self::stats), named with its peer address in a
    /// `tracing` warning, and reported as [`ServerEvent::ProtocolError`]
    /// with `rank: None`, which a launcher should only report: it does not
    /// concern any rank of the job.
    ///
    /// # Errors
    ///
    /// [`ServerError::Listen`], [`ServerError::Spawn`].
    pub fn listen_tcp_with(
        &self,
        addr: impl ToSocketAddrs,
        options: PortOptions,
    ) -> Result<(u16, JoinHandle<()>), ServerError> {
        let listener = TcpListener::bind(addr).map_err(|source| ServerError::Listen { source })?;
        let local = listener
            .local_addr()
            .map_err(|source| ServerError::Listen { source })?;
        self.shared.lock().listeners.push(local);
        let shared = Arc::clone(&self.shared);
        let name = format!("pmi-accept-{}", local.port());
        let authenticated = options.requires_secret();
        let handle = thread::Builder::new()
            .name(name.clone())
            .spawn(move || shared.accept_loop(&listener, &Arc::new(options)))
            .map_err(|source| ServerError::Spawn { name, source })?;
        debug!(%local, authenticated, "PMI_PORT listener");
        Ok((local.port(), handle))
    }
}

impl Shared {
    fn accept_loop(self: &Arc<Self>, listener: &TcpListener, options: &Arc<PortOptions>) {
        let in_handshake = Arc::new(InHandshake::default());
        let per_source = options
            .max_handshakes_per_source
            .min(options.max_handshakes);
        // Connections from an address that had its share of handshake
        // slots, oldest first: each starts, with a thread, once a slot of
        // its address frees. At most `max_handshakes` wait; one more is
        // closed.
        let mut parked: VecDeque<Parked> = VecDeque::new();
        loop {
            if self.lock().shutdown {
                return;
            }
            self.start_parked(&mut parked, &in_handshake, per_source, options);
            if in_handshake.total() >= options.max_handshakes {
                // At the cap, leave new connections in the listen queue.
                thread::sleep(CAP_POLL);
                continue;
            }
            // With connections parked, look at them again soon.
            let wait = (!parked.is_empty()).then_some(CAP_POLL);
            if !sys::wait_readable(listener.as_fd(), wait).unwrap_or(true) {
                continue;
            }
            let stream = listener.accept().map(|(stream, _)| stream);
            if self.lock().shutdown {
                return;
            }
            let stream = match stream {
                Ok(stream) => stream,
                Err(e) => {
                    bump(&self.counters.accept_errors);
                    warn!(error = %e, "PMI_PORT accept failed");
                    // Out of descriptors, typically: do not spin.
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            bump(&self.counters.connections_accepted);
            let source = stream.peer_addr().ok();
            let connection = Parked {
                peer: source.map_or_else(|| "an unknown peer".to_owned(), |a| a.to_string()),
                source: source.map(|a| a.ip()),
                stream,
            };
            // Only this thread takes slots, so the check cannot race.
            if in_handshake.from(connection.source) < per_source {
                self.start_handshake(connection, &in_handshake, options);
            } else if parked.len() < options.max_handshakes {
                bump(&self.counters.connections_waiting);
                parked.push_back(connection);
            } else {
                self.refuse_over_cap(
                    &connection.peer,
                    format!(
                        "{per_source} connections from its address in their handshake, \
                         and {} waiting",
                        parked.len()
                    ),
                );
            }
        }
    }

    /// Starts the parked connections whose address has a slot free again,
    /// oldest first, while the listener is under its cap.
    fn start_parked(
        self: &Arc<Self>,
        parked: &mut VecDeque<Parked>,
        in_handshake: &Arc<InHandshake>,
        per_source: usize,
        options: &Arc<PortOptions>,
    ) {
        let mut index = 0;
        while index < parked.len() && in_handshake.total() < options.max_handshakes {
            if in_handshake.from(parked[index].source) < per_source {
                if let Some(connection) = parked.remove(index) {
                    self.counters
                        .connections_waiting
                        .fetch_sub(1, Ordering::Relaxed);
                    self.start_handshake(connection, in_handshake, options);
                }
            } else {
                index += 1;
            }
        }
    }

    /// Takes a handshake slot for `connection` and runs its handshake on a
    /// thread of its own.
    fn start_handshake(
        self: &Arc<Self>,
        connection: Parked,
        in_handshake: &Arc<InHandshake>,
        options: &Arc<PortOptions>,
    ) {
        let Parked {
            stream,
            source,
            peer,
        } = connection;
        let slot = HandshakeSlot::take(in_handshake, source, self);
        let shared = Arc::clone(self);
        let options = Arc::clone(options);
        let conn_peer = peer.clone();
        let spawned = thread::Builder::new()
            .name("pmi-port-conn".into())
            .spawn(move || shared.port_connection(stream, &conn_peer, &options, slot));
        if let Err(e) = spawned {
            // The closure, its stream and its slot were dropped.
            self.refuse_over_cap(&peer, format!("cannot start a thread: {e}"));
        }
    }

    fn refuse_over_cap(&self, peer: &str, why: String) {
        bump(&self.counters.connections_refused_over_cap);
        let detail = format!("PMI_PORT connection from {peer} refused: {why}");
        warn!(peer, detail, "PMI_PORT connection refused");
        self.event(ServerEvent::ProtocolError { rank: None, detail });
    }

    /// Runs the handshake on a port-mode connection (the challenge first if
    /// the listener has a secret), then serves the rank it names.
    fn port_connection(
        &self,
        stream: TcpStream,
        peer: &str,
        options: &PortOptions,
        slot: HandshakeSlot,
    ) {
        let fail = |counter: &AtomicU64, detail: String| {
            bump(counter);
            let detail = format!("PMI_PORT connection from {peer}: {detail}");
            warn!(peer, detail, "PMI_PORT handshake failed; connection closed");
            self.event(ServerEvent::ProtocolError { rank: None, detail });
        };
        let failed = &self.counters.handshake_failures;
        if let Err(e) = stream.set_nodelay(true) {
            return fail(failed, format!("configuring the connection: {e}"));
        }
        let timeout = options.handshake_timeout;
        let mut conn = BufReader::new(PortStream {
            stream,
            deadline: Some(Instant::now() + timeout),
        });
        let io_detail = |what: &str, e: &io::Error| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                format!("{what}: handshake not done within {timeout:?}")
            }
            _ => format!("{what}: {e}"),
        };
        let nonce = match &options.secret {
            None => None,
            Some(_) => {
                let nonce = match auth::new_nonce() {
                    Ok(nonce) => nonce,
                    Err(e) => return fail(failed, e.to_string()),
                };
                if let Err(e) = send(conn.get_mut(), &challenge_message(&nonce)) {
                    return fail(failed, io_detail("sending the challenge", &e));
                }
                Some(nonce)
            }
        };
        let handshake = match wire::read_message(&mut conn) {
            Ok(Some(msg)) => {
                let mut guarded = self.lock();
                match (&options.secret, &nonce) {
                    (Some(secret), Some(nonce)) => {
                        guarded.core.handle_proved_initack(&msg, secret, nonce)
                    }
                    _ => guarded.core.handle_initack(&msg),
                }
            }
            Ok(None) => return fail(failed, "connection closed before initack".into()),
            Err(ReadError::Io(e)) => return fail(failed, io_detail("reading initack", &e)),
            Err(ReadError::Malformed(e)) => {
                let _ = send(conn.get_mut(), &Message::new("initack").with("rc", "-1"));
                return fail(failed, format!("malformed initack: {e}"));
            }
        };
        match handshake {
            Handshake::Accepted { rank, replies } => {
                let sent = replies
                    .iter()
                    .try_for_each(|reply| send(conn.get_mut(), reply))
                    .and_then(|()| conn.get_mut().end_handshake());
                drop(slot);
                bump(&self.counters.handshakes_completed);
                self.event(ServerEvent::Connected { rank });
                match sent {
                    Ok(()) => self.run(&mut conn, rank),
                    Err(e) => {
                        self.event(ServerEvent::Disconnected {
                            rank,
                            error: Some(e),
                        });
                    }
                }
            }
            Handshake::Rejected {
                reply,
                detail,
                reason,
            } => {
                let _ = send(conn.get_mut(), &reply);
                let counter = match reason {
                    Refusal::RankClaimed => &self.counters.claims_refused,
                    _ => failed,
                };
                fail(counter, detail);
            }
        }
    }
}

/// An accepted connection, before its handshake starts.
#[derive(Debug)]
struct Parked {
    stream: TcpStream,
    source: Option<IpAddr>,
    /// Its address and port, for messages.
    peer: String,
}

/// The connections of one listener in their handshake: in all, and by
/// source address.
#[derive(Debug, Default)]
struct InHandshake {
    total: AtomicUsize,
    by_source: Mutex<HashMap<Option<IpAddr>, usize>>,
}

impl InHandshake {
    fn sources(&self) -> MutexGuard<'_, HashMap<Option<IpAddr>, usize>> {
        self.by_source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn total(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }

    fn from(&self, source: Option<IpAddr>) -> usize {
        self.sources().get(&source).copied().unwrap_or(0)
    }
}

/// One of a listener's handshake places, given back when dropped.
#[derive(Debug)]
struct HandshakeSlot {
    in_handshake: Arc<InHandshake>,
    source: Option<IpAddr>,
    shared: Arc<Shared>,
}

impl HandshakeSlot {
    fn take(in_handshake: &Arc<InHandshake>, source: Option<IpAddr>, shared: &Arc<Shared>) -> Self {
        in_handshake.total.fetch_add(1, Ordering::AcqRel);
        *in_handshake.sources().entry(source).or_insert(0) += 1;
        bump(&shared.counters.handshakes_in_progress);
        Self {
            in_handshake: Arc::clone(in_handshake),
            source,
            shared: Arc::clone(shared),
        }
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        {
            let mut sources = self.in_handshake.sources();
            if let Some(count) = sources.get_mut(&self.source) {
                *count -= 1;
                if *count == 0 {
                    sources.remove(&self.source);
                }
            }
        }
        self.in_handshake.total.fetch_sub(1, Ordering::AcqRel);
        self.shared
            .counters
            .handshakes_in_progress
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// A port-mode connection under the handshake deadline: every read and
/// write gets at most the time left.
#[derive(Debug)]
struct PortStream {
    stream: TcpStream,
    /// `None` once the handshake is over.
    deadline: Option<Instant>,
}

impl PortStream {
    /// The time left, as a socket timeout; an error once it is up.
    fn time_left(&self) -> io::Result<Option<Duration>> {
        match self.deadline {
            None => Ok(None),
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Ok(Some(left)),
                _ => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the handshake deadline has passed",
                )),
            },
        }
    }

    /// Lifts the deadline: the connection now belongs to a rank, which may
    /// stay silent as long as it likes (in a barrier, say).
    fn end_handshake(&mut self) -> io::Result<()> {
        self.deadline = None;
        self.stream.set_read_timeout(None)?;
        self.stream.set_write_timeout(None)
    }
}

impl Read for PortStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(left) = self.time_left()? {
            self.stream.set_read_timeout(Some(left))?;
        }
        self.stream.read(buf)
    }
}

impl Write for PortStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(left) = self.time_left()? {
            self.stream.set_write_timeout(Some(left))?;
        }
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}
