//! Port mode (`PMI_PORT`): the TCP listeners of [`Server::listen_tcp_with`]
//! and its variants, the handshake of each connection under a deadline
//! (with the job secret's challenge when [`PortOptions::with_secret`] asks
//! for it), and the cap on connections in their handshake. See the [module
//! docs](super#port-mode).

use std::io::{self, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::handshake::challenge_message;
use super::threaded::{Shared, bump, send};
use super::{Handshake, Refusal, Server, ServerError, ServerEvent};
use crate::auth::{self, JobSecret};
use crate::wire::{self, Message, ReadError};

/// Default of [`PortOptions::with_handshake_timeout`]: how long a
/// port-mode connection may take, from its accept to the end of the
/// server's handshake replies.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of [`PortOptions::with_max_handshakes`]: how many port-mode
/// connections may be in their handshake at once, per listener.
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;

/// How [`Server::listen_tcp_with`] serves port-mode connections. Build it
/// with [`PortOptions::new`] (or `default()`) and the `with_*` methods.
#[derive(Debug, Clone)]
pub struct PortOptions {
    secret: Option<JobSecret>,
    handshake_timeout: Duration,
    max_handshakes: usize,
}

impl Default for PortOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl PortOptions {
    /// No secret (the plain `initack` handshake), a handshake time of
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`] and at most [`DEFAULT_MAX_HANDSHAKES`]
    /// connections in their handshake at once.
    pub fn new() -> Self {
        Self {
            secret: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
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
    /// once (at least 1); a connection accepted beyond that is closed at
    /// once, counted in [`ServerStats::connections_refused_over_cap`] and
    /// reported. The listener thus runs at most this many handshake threads
    /// plus one thread per connected rank.
    ///
    /// [`ServerStats::connections_refused_over_cap`]: super::ServerStats::connections_refused_over_cap
    #[must_use]
    pub fn with_max_handshakes(mut self, max: usize) -> Self {
        self.max_handshakes = max.max(1);
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
        let in_handshake = Arc::new(AtomicUsize::new(0));
        for stream in listener.incoming() {
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
            let peer = stream
                .peer_addr()
                .map_or_else(|_| "an unknown peer".to_owned(), |a| a.to_string());
            // Only this thread increments, so the check cannot race.
            if in_handshake.load(Ordering::Acquire) >= options.max_handshakes {
                drop(stream);
                self.refuse_over_cap(
                    &peer,
                    format!(
                        "{} connections already in their handshake",
                        options.max_handshakes
                    ),
                );
                continue;
            }
            let slot = HandshakeSlot::take(&in_handshake, self);
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

/// One of a listener's handshake places, given back when dropped.
#[derive(Debug)]
struct HandshakeSlot {
    in_handshake: Arc<AtomicUsize>,
    shared: Arc<Shared>,
}

impl HandshakeSlot {
    fn take(in_handshake: &Arc<AtomicUsize>, shared: &Arc<Shared>) -> Self {
        in_handshake.fetch_add(1, Ordering::AcqRel);
        bump(&shared.counters.handshakes_in_progress);
        Self {
            in_handshake: Arc::clone(in_handshake),
            shared: Arc::clone(shared),
        }
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.in_handshake.fetch_sub(1, Ordering::AcqRel);
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
