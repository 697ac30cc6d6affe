//! The PMI-1 server of the udrun launcher: a sans-IO [`ServerCore`] and the
//! threaded [`Server`] that drives it over one stream per rank.
//!
//! # The core
//!
//! [`ServerCore`] holds the job's key-value space and barrier. It does no
//! I/O: a driver reads a [`Message`] from rank `r`'s connection, calls
//! [`ServerCore::handle`]`(r, &msg)` and carries out the returned
//! [`Action`]. Every request costs O(1) (a hash map look-up) except the
//! barrier's release, which is O(size) once per barrier. In port mode
//! (`PMI_PORT`) the first message of a connection goes to
//! [`ServerCore::handle_initack`] instead, which tells its rank; a line that
//! does not parse goes to [`ServerCore::handle_malformed`].
//!
//! Served subset: `init`, `get_maxes` (256/64/1024), `get_appnum` (0),
//! `get_universe_size` (the job size), `get_my_kvsname`, `put`, `get`,
//! `barrier_in`/`barrier_out`, `finalize`, `abort`, and the `initack`
//! handshake. `spawn` (either form), `publish_name`, `unpublish_name` and
//! `lookup_name` get their usual reply with `rc=-1`; any other command gets
//! `cmd=<cmd>_result rc=-1 msg=unknown_command`.
//!
//! # The threaded driver
//!
//! [`Server`] runs one thread per connection (fine up to hundreds of ranks)
//! around a `Mutex<ServerCore>`; ranks held in a barrier wait on a `Condvar`.
//! What the launcher must act on arrives as [`ServerEvent`]s on the
//! `mpsc::Sender` given to [`Server::new`]. A rank that sends garbage gets an
//! error reply where possible, its connection is closed and
//! [`ServerEvent::ProtocolError`] reported; the server neither panics nor
//! hangs for the other ranks. A launcher that wants to know when barriers
//! complete (udrun's `--report-startup` times the first one) asks for
//! [`ServerEvent::BarrierReleased`] with [`Server::report_barriers`].

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tracing::{debug, trace, warn};

use crate::client::RESERVED_PREFIX;
use crate::wire::{self, Message, ReadError, WireError};

/// `kvsname_max` advertised by `get_maxes`.
pub const KVSNAME_MAX: usize = 256;
/// `keylen_max` advertised by `get_maxes`; `put` refuses longer keys.
pub const KEYLEN_MAX: usize = 64;
/// `vallen_max` advertised by `get_maxes`; `put` refuses longer values.
pub const VALLEN_MAX: usize = 1024;

/// How long a port-mode connection may take to send its `initack`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a driver must do after [`ServerCore::handle`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Action {
    /// Send this reply to the rank.
    Reply(Message),
    /// The rank entered a barrier that other ranks have not: send nothing
    /// now. It gets `cmd=barrier_out rc=0` when a later call returns
    /// [`Action::Release`] (equivalently, when
    /// [`barrier_epoch`](ServerCore::barrier_epoch) changes).
    ReplyLater,
    /// The last rank entered the barrier: send `reply` to every rank in
    /// `ranks` (all ranks of the job, the caller included).
    Release {
        /// The held ranks, in increasing order.
        ranks: Vec<u32>,
        /// `cmd=barrier_out rc=0`.
        reply: Message,
    },
    /// The rank asked to abort the job; no reply is expected. Report it to
    /// the launcher, which should kill the job and exit with `code`.
    Abort {
        /// The rank that aborted.
        rank: u32,
        /// Its requested exit code (1 if it sent none or garbage).
        code: i32,
        /// Its message (underscores stand for spaces).
        message: String,
    },
    /// The rank finalized: send `reply` (`finalize_ack`), expect nothing
    /// more from it but the end of the stream.
    Finalized {
        /// `cmd=finalize_ack rc=0`.
        reply: Message,
    },
    /// Protocol error: send `reply` if there is one, close the connection
    /// and report `detail`.
    Close {
        /// An error reply (`rc=-1`) to send first, when one fits.
        reply: Option<Message>,
        /// What went wrong, for the launcher.
        detail: String,
    },
}

/// The outcome of [`ServerCore::handle_initack`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Handshake {
    /// The connection is rank `rank`: send `replies` (`cmd=initack`, then
    /// `cmd=set size=`, `cmd=set rank=`, `cmd=set debug=0`) and carry on with
    /// [`ServerCore::handle`].
    Accepted {
        /// The rank named by `pmiid`.
        rank: u32,
        /// The four handshake lines.
        replies: Vec<Message>,
    },
    /// Send `reply` and close the connection.
    Rejected {
        /// `cmd=initack rc=-1 msg=...`.
        reply: Message,
        /// Why, for the launcher.
        detail: String,
    },
}

/// A failure to set up the server or a connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The job size is 0.
    #[error("a PMI job needs at least one rank")]
    EmptyJob,
    /// The kvsname cannot be sent on the wire or is too long.
    #[error("invalid kvsname {name:?}: {reason}")]
    InvalidKvsname {
        /// The name (truncated).
        name: String,
        /// Why.
        reason: String,
    },
    /// The rank is not below the job size.
    #[error("rank {rank} is out of range for a job of {size}")]
    RankOutOfRange {
        /// The rank.
        rank: u32,
        /// The job size.
        size: u32,
    },
    /// The rank already has a connection.
    #[error("rank {rank} already has a PMI connection")]
    AlreadyConnected {
        /// The rank.
        rank: u32,
    },
    /// A thread could not be started.
    #[error("starting the PMI thread {name}: {source}")]
    Spawn {
        /// The thread's name.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The port-mode listener could not be set up.
    #[error("setting up the PMI_PORT listener: {source}")]
    Listen {
        /// The socket error.
        #[source]
        source: io::Error,
    },
}

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

/// Per-rank protocol state.
#[derive(Debug, Clone, Copy, Default)]
struct RankState {
    attached: bool,
    in_barrier: bool,
    finalized: bool,
}

/// The sans-IO PMI-1 server: the job's key-value space and barrier. See the
/// [module docs](self).
#[derive(Debug)]
pub struct ServerCore {
    size: u32,
    kvsname: String,
    appnum: u32,
    kvs: HashMap<String, String>,
    ranks: Vec<RankState>,
    barrier_count: u32,
    barrier_epoch: u64,
}

impl ServerCore {
    /// A server for ranks `0..size` with key-value space `kvsname`.
    ///
    /// # Errors
    ///
    /// [`ServerError::EmptyJob`] if `size` is 0;
    /// [`ServerError::InvalidKvsname`] unless `kvsname` is non-empty
    /// printable ASCII without space, shorter than [`KVSNAME_MAX`].
    pub fn new(size: u32, kvsname: impl Into<String>) -> Result<Self, ServerError> {
        let kvsname = kvsname.into();
        if size == 0 {
            return Err(ServerError::EmptyJob);
        }
        let reason = if kvsname.is_empty() || !wire::is_valid_value(&kvsname) {
            Some("must be non-empty printable ASCII without space".to_owned())
        } else if kvsname.len() >= KVSNAME_MAX {
            Some(format!("must be shorter than {KVSNAME_MAX} bytes"))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ServerError::InvalidKvsname {
                name: wire::snippet(&kvsname),
                reason,
            });
        }
        Ok(Self {
            size,
            kvsname,
            appnum: 0,
            kvs: HashMap::new(),
            ranks: vec![RankState::default(); size as usize],
            barrier_count: 0,
            barrier_epoch: 0,
        })
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The key-value space name.
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }

    /// How many barriers have completed; it changes exactly when a call
    /// returns [`Action::Release`].
    pub fn barrier_epoch(&self) -> u64 {
        self.barrier_epoch
    }

    /// Records that `rank` has a connection, so that no second one (e.g. a
    /// port-mode `initack` naming the same rank) can claim it.
    ///
    /// # Errors
    ///
    /// [`ServerError::RankOutOfRange`], [`ServerError::AlreadyConnected`].
    pub fn attach(&mut self, rank: u32) -> Result<(), ServerError> {
        let size = self.size;
        let state = self
            .ranks
            .get_mut(rank as usize)
            .ok_or(ServerError::RankOutOfRange { rank, size })?;
        if state.attached {
            return Err(ServerError::AlreadyConnected { rank });
        }
        state.attached = true;
        Ok(())
    }

    /// Undoes [`attach`](Self::attach) for a connection that never started.
    fn detach(&mut self, rank: u32) {
        if let Some(state) = self.ranks.get_mut(rank as usize) {
            state.attached = false;
        }
    }

    /// Handles the first message of a port-mode connection, `cmd=initack
    /// pmiid=<rank>`, and attaches that rank.
    pub fn handle_initack(&mut self, msg: &Message) -> Handshake {
        let reject = |msg: &str, detail: String| Handshake::Rejected {
            reply: Message::new("initack").with("rc", "-1").with("msg", msg),
            detail,
        };
        if msg.cmd() != "initack" || msg.is_multiline() {
            return reject(
                "expected_initack",
                format!("expected cmd=initack, got cmd={}", wire::snippet(msg.cmd())),
            );
        }
        let Some(rank) = msg.get("pmiid").and_then(|id| id.parse::<u32>().ok()) else {
            return reject(
                "invalid_pmiid",
                format!(
                    "initack with pmiid {:?}",
                    msg.get("pmiid").map(wire::snippet)
                ),
            );
        };
        if let Err(e) = self.attach(rank) {
            return reject("pmiid_refused", e.to_string());
        }
        debug!(rank, "PMI_PORT handshake");
        Handshake::Accepted {
            rank,
            replies: vec![
                Message::new("initack"),
                Message::new("set").with("size", self.size.to_string()),
                Message::new("set").with("rank", rank.to_string()),
                Message::new("set").with("debug", "0"),
            ],
        }
    }

    /// A line from `rank` that did not parse: an error reply and
    /// [`Action::Close`].
    pub fn handle_malformed(&mut self, rank: Option<u32>, error: &WireError) -> Action {
        Action::Close {
            reply: Some(
                Message::new("error")
                    .with("rc", "-1")
                    .with("msg", "malformed_request"),
            ),
            detail: match rank {
                Some(rank) => format!("rank {rank}: {error}"),
                None => error.to_string(),
            },
        }
    }

    /// Handles one request from `rank`. Never panics, whatever `msg` holds.
    pub fn handle(&mut self, rank: u32, msg: &Message) -> Action {
        let Some(state) = self.ranks.get(rank as usize).copied() else {
            return Action::Close {
                reply: None,
                detail: format!("rank {rank} is out of range for a job of {}", self.size),
            };
        };
        let cmd = msg.cmd();
        trace!(rank, request = %msg, "PMI request");
        if state.finalized {
            return Action::Close {
                reply: error_reply(cmd, "already_finalized"),
                detail: format!("rank {rank}: cmd={} after finalize", wire::snippet(cmd)),
            };
        }
        if msg.is_multiline() {
            return Action::Reply(unsupported(cmd));
        }
        match cmd {
            "init" => Action::Reply(self.init(msg)),
            "get_maxes" => Action::Reply(
                Message::new("maxes")
                    .with("kvsname_max", KVSNAME_MAX.to_string())
                    .with("keylen_max", KEYLEN_MAX.to_string())
                    .with("vallen_max", VALLEN_MAX.to_string())
                    .with("rc", "0"),
            ),
            "get_appnum" => Action::Reply(
                Message::new("appnum")
                    .with("appnum", self.appnum.to_string())
                    .with("rc", "0"),
            ),
            "get_universe_size" => Action::Reply(
                Message::new("universe_size")
                    .with("size", self.size.to_string())
                    .with("rc", "0"),
            ),
            "get_my_kvsname" => Action::Reply(
                Message::new("my_kvsname")
                    .with("kvsname", self.kvsname.as_str())
                    .with("rc", "0"),
            ),
            "put" => Action::Reply(self.put(msg)),
            "get" => Action::Reply(self.get(msg)),
            "barrier_in" => self.barrier_in(rank),
            "finalize" => {
                self.ranks[rank as usize].finalized = true;
                debug!(rank, "PMI finalize");
                Action::Finalized {
                    reply: Message::new("finalize_ack").with("rc", "0"),
                }
            }
            "abort" => {
                let code = msg
                    .get("exitcode")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(1);
                let message = msg.get("message").unwrap_or_default().to_owned();
                debug!(rank, code, message, "PMI abort");
                Action::Abort {
                    rank,
                    code,
                    message,
                }
            }
            "initack" => Action::Close {
                reply: Some(
                    Message::new("initack")
                        .with("rc", "-1")
                        .with("msg", "unexpected"),
                ),
                detail: format!("rank {rank}: initack on an established connection"),
            },
            "spawn" | "publish_name" | "unpublish_name" | "lookup_name" => {
                Action::Reply(unsupported(cmd))
            }
            _ => match error_reply(cmd, "unknown_command") {
                Some(reply) => Action::Reply(reply),
                None => Action::Close {
                    reply: None,
                    detail: format!("rank {rank}: unusable command {:?}", wire::snippet(cmd)),
                },
            },
        }
    }

    fn init(&self, msg: &Message) -> Message {
        let reply = Message::new("response_to_init")
            .with("pmi_version", "1")
            .with("pmi_subversion", "1");
        match msg.get("pmi_version") {
            Some("1") | None => reply.with("rc", "0"),
            Some(_) => reply
                .with("rc", "-1")
                .with("msg", "only_pmi_version_1_is_supported"),
        }
    }

    fn put(&mut self, msg: &Message) -> Message {
        let fail = |why: &str| Message::new("put_result").with("rc", "-1").with("msg", why);
        if msg.get("kvsname").is_some_and(|k| k != self.kvsname) {
            return fail("unknown_kvsname");
        }
        let (Some(key), Some(value)) = (msg.get("key"), msg.get("value")) else {
            return fail("missing_key_or_value");
        };
        if key.starts_with(RESERVED_PREFIX) {
            return fail("reserved_key");
        }
        if key.len() > KEYLEN_MAX {
            return fail("key_too_long");
        }
        if value.len() > VALLEN_MAX {
            return fail("value_too_long");
        }
        if !wire::is_valid_key(key) || !wire::is_valid_value(value) {
            return fail("invalid_key_or_value");
        }
        self.kvs.insert(key.to_owned(), value.to_owned());
        Message::new("put_result")
            .with("rc", "0")
            .with("msg", "success")
    }

    fn get(&self, msg: &Message) -> Message {
        let reply = Message::new("get_result");
        if msg.get("kvsname").is_some_and(|k| k != self.kvsname) {
            return reply.with("rc", "-1").with("msg", "unknown_kvsname");
        }
        let Some(key) = msg.get("key") else {
            return reply.with("rc", "-1").with("msg", "missing_key");
        };
        let value = match key {
            "PMI_process_mapping" => Some(format!("(vector,(0,1,{}))", self.size)),
            _ => self.kvs.get(key).cloned(),
        };
        match value {
            Some(value) => reply
                .with("rc", "0")
                .with("msg", "success")
                .with("value", value),
            None => {
                let why = if key.len() <= KEYLEN_MAX && wire::is_valid_key(key) {
                    format!("key_{key}_not_found")
                } else {
                    "key_not_found".to_owned()
                };
                reply
                    .with("rc", "-1")
                    .with("msg", why)
                    .with("value", "unknown")
            }
        }
    }

    fn barrier_in(&mut self, rank: u32) -> Action {
        let state = &mut self.ranks[rank as usize];
        if state.in_barrier {
            return Action::Close {
                reply: Some(
                    Message::new("barrier_out")
                        .with("rc", "-1")
                        .with("msg", "already_in_barrier"),
                ),
                detail: format!("rank {rank}: barrier_in twice"),
            };
        }
        state.in_barrier = true;
        self.barrier_count += 1;
        if self.barrier_count < self.size {
            return Action::ReplyLater;
        }
        let mut ranks = Vec::with_capacity(self.size as usize);
        for (r, state) in (0..).zip(self.ranks.iter_mut()) {
            if std::mem::take(&mut state.in_barrier) {
                ranks.push(r);
            }
        }
        self.barrier_count = 0;
        self.barrier_epoch += 1;
        debug!(epoch = self.barrier_epoch, "PMI barrier released");
        Action::Release {
            ranks,
            reply: barrier_out(),
        }
    }
}

fn barrier_out() -> Message {
    Message::new("barrier_out").with("rc", "0")
}

/// `cmd=<cmd>_result rc=-1 msg=<why>`, if `cmd` can be sent back.
fn error_reply(cmd: &str, why: &str) -> Option<Message> {
    let name = format!("{cmd}_result");
    wire::is_valid_key(&name).then(|| Message::new(name).with("rc", "-1").with("msg", why))
}

/// The usual reply of a command we do not serve, with `rc=-1`.
fn unsupported(cmd: &str) -> Message {
    let name = match cmd {
        "spawn" => "spawn_result",
        "publish_name" => "publish_result",
        "unpublish_name" => "unpublish_result",
        "lookup_name" => "lookup_result",
        _ => return error_reply(cmd, "unknown_command").unwrap_or_else(|| Message::new("error")),
    };
    Message::new(name)
        .with("rc", "-1")
        .with("msg", format!("{cmd}_not_supported"))
}

/// The threaded PMI-1 server: one thread per rank connection around a
/// shared [`ServerCore`]. Cloning gives another handle to the same server.
#[derive(Debug, Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    core: Mutex<Guarded>,
    released: Condvar,
    events: Sender<ServerEvent>,
    /// Whether to send [`ServerEvent::BarrierReleased`].
    barrier_events: AtomicBool,
}

#[derive(Debug)]
struct Guarded {
    core: ServerCore,
    shutdown: bool,
    listeners: Vec<SocketAddr>,
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

    /// Listens for port-mode connections (`PMI_PORT=<host>:<port>`,
    /// `PMI_ID=<rank>`) on `addr` and serves each on its own thread once its
    /// `initack` names a rank that has no connection yet. Returns the bound
    /// port (useful with port 0) and the accept thread, which runs until
    /// [`shutdown`](Self::shutdown).
    ///
    /// Anyone who can connect can read and write the key-value space: bind
    /// to a loopback or cluster-private address.
    ///
    /// # Errors
    ///
    /// [`ServerError::Listen`], [`ServerError::Spawn`].
    pub fn listen_tcp(
        &self,
        addr: impl ToSocketAddrs,
    ) -> Result<(u16, JoinHandle<()>), ServerError> {
        let listener = TcpListener::bind(addr).map_err(|source| ServerError::Listen { source })?;
        let local = listener
            .local_addr()
            .map_err(|source| ServerError::Listen { source })?;
        self.shared.lock().listeners.push(local);
        let shared = Arc::clone(&self.shared);
        let name = format!("pmi-accept-{}", local.port());
        let handle = thread::Builder::new()
            .name(name.clone())
            .spawn(move || shared.accept_loop(&listener))
            .map_err(|source| ServerError::Spawn { name, source })?;
        debug!(%local, "PMI_PORT listener");
        Ok((local.port(), handle))
    }

    /// From now on, also report every barrier release as
    /// [`ServerEvent::BarrierReleased`]. Off by default, so that a launcher
    /// that does not care sees only the events that need action. Call it
    /// before serving any rank to be sure to see the first barrier.
    pub fn report_barriers(&self) {
        self.shared.barrier_events.store(true, Ordering::Relaxed);
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
    fn lock(&self) -> MutexGuard<'_, Guarded> {
        // A panic while holding the lock cannot leave the core half-updated
        // in a way that matters more than stopping the whole job would.
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn event(&self, event: ServerEvent) {
        // The launcher may have stopped listening; nothing else to do then.
        let _ = self.events.send(event);
    }

    /// Serves one rank until its stream ends.
    fn run<S: Read + Write>(&self, conn: &mut BufReader<S>, rank: u32) {
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

    fn accept_loop(self: &Arc<Self>, listener: &TcpListener) {
        for stream in listener.incoming() {
            if self.lock().shutdown {
                return;
            }
            let stream = match stream {
                Ok(stream) => stream,
                Err(e) => {
                    warn!(error = %e, "PMI_PORT accept failed");
                    // Out of descriptors, typically: do not spin.
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let shared = Arc::clone(self);
            let spawned = thread::Builder::new()
                .name("pmi-port-conn".into())
                .spawn(move || shared.port_connection(stream));
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start a PMI_PORT connection thread");
            }
        }
    }

    /// Runs the `initack` handshake on a port-mode connection, then serves
    /// the rank it names.
    fn port_connection(&self, stream: TcpStream) {
        let reject = |detail: String| {
            warn!(detail, "PMI_PORT handshake failed");
            self.event(ServerEvent::ProtocolError { rank: None, detail });
        };
        let setup = stream
            .set_nodelay(true)
            .and_then(|()| stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)));
        if let Err(e) = setup {
            return reject(format!("configuring the connection: {e}"));
        }
        let mut conn = BufReader::new(stream);
        let handshake = match wire::read_message(&mut conn) {
            Ok(Some(msg)) => self.lock().core.handle_initack(&msg),
            Ok(None) => return reject("connection closed before initack".into()),
            Err(ReadError::Io(e)) => return reject(format!("reading initack: {e}")),
            Err(ReadError::Malformed(e)) => {
                let _ = send(conn.get_mut(), &Message::new("initack").with("rc", "-1"));
                return reject(format!("malformed initack: {e}"));
            }
        };
        match handshake {
            Handshake::Accepted { rank, replies } => {
                let sent = replies
                    .iter()
                    .try_for_each(|reply| send(conn.get_mut(), reply));
                let sent = sent.and_then(|()| conn.get_ref().set_read_timeout(None));
                match sent {
                    Ok(()) => self.run(&mut conn, rank),
                    Err(e) => self.event(ServerEvent::Disconnected {
                        rank,
                        error: Some(e),
                    }),
                }
            }
            Handshake::Rejected { reply, detail } => {
                let _ = send(conn.get_mut(), &reply);
                reject(detail);
            }
        }
    }
}

/// Writes one message and flushes it.
fn send<W: Write>(writer: &mut W, msg: &Message) -> io::Result<()> {
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

    fn core(size: u32) -> ServerCore {
        ServerCore::new(size, "kvs_test").unwrap()
    }

    fn msg(line: &str) -> Message {
        Message::parse(line.as_bytes()).unwrap()
    }

    fn reply(action: Action) -> Message {
        match action {
            Action::Reply(m) => m,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn rejects_bad_construction() {
        assert!(matches!(
            ServerCore::new(0, "k"),
            Err(ServerError::EmptyJob)
        ));
        assert!(matches!(
            ServerCore::new(1, "a b"),
            Err(ServerError::InvalidKvsname { .. })
        ));
        assert!(matches!(
            ServerCore::new(1, ""),
            Err(ServerError::InvalidKvsname { .. })
        ));
        let long = "k".repeat(KVSNAME_MAX);
        assert!(matches!(
            ServerCore::new(1, long),
            Err(ServerError::InvalidKvsname { .. })
        ));
    }

    #[test]
    fn session_replies() {
        let mut c = core(4);
        let r = reply(c.handle(2, &msg("cmd=init pmi_version=1 pmi_subversion=2")));
        assert_eq!(
            r.to_line().unwrap(),
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"
        );
        let r = reply(c.handle(2, &msg("cmd=init pmi_version=2 pmi_subversion=0")));
        assert_eq!(r.get("rc"), Some("-1"));
        let r = reply(c.handle(2, &msg("cmd=get_maxes")));
        assert_eq!(
            r.to_line().unwrap(),
            "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n"
        );
        assert_eq!(
            reply(c.handle(2, &msg("cmd=get_appnum"))).get("appnum"),
            Some("0")
        );
        assert_eq!(
            reply(c.handle(2, &msg("cmd=get_universe_size"))).get("size"),
            Some("4")
        );
        assert_eq!(
            reply(c.handle(2, &msg("cmd=get_my_kvsname"))).get("kvsname"),
            Some("kvs_test")
        );
    }

    #[test]
    fn put_get_like_hydra() {
        let mut c = core(2);
        let r = reply(c.handle(
            0,
            &msg("cmd=put kvsname=kvs_test key=addr-0 value=udp://x:1"),
        ));
        assert_eq!(r.to_line().unwrap(), "cmd=put_result rc=0 msg=success\n");
        let r = reply(c.handle(1, &msg("cmd=get kvsname=kvs_test key=addr-0")));
        assert_eq!(
            r.to_line().unwrap(),
            "cmd=get_result rc=0 msg=success value=udp://x:1\n"
        );
        let r = reply(c.handle(1, &msg("cmd=get kvsname=kvs_test key=nonexistent")));
        assert_eq!(
            r.to_line().unwrap(),
            "cmd=get_result rc=-1 msg=key_nonexistent_not_found value=unknown\n"
        );
        let r = reply(c.handle(1, &msg("cmd=get kvsname=kvs_test key=PMI_process_mapping")));
        assert_eq!(r.get("value"), Some("(vector,(0,1,2))"));
        let r = reply(c.handle(1, &msg("cmd=get kvsname=other key=addr-0")));
        assert_eq!(r.get("rc"), Some("-1"));
    }

    #[test]
    fn put_refusals() {
        let mut c = core(1);
        let long_key = format!("cmd=put key={} value=v", "k".repeat(KEYLEN_MAX + 1));
        let long_value = format!("cmd=put key=k value={}", "v".repeat(VALLEN_MAX + 1));
        for (line, why) in [
            (
                "cmd=put kvsname=kvs_test key=PMI_process_mapping value=x",
                "reserved_key",
            ),
            ("cmd=put key=PMI_anything value=x", "reserved_key"),
            (long_key.as_str(), "key_too_long"),
            (long_value.as_str(), "value_too_long"),
            ("cmd=put key=k", "missing_key_or_value"),
            ("cmd=put key=k value=caf\u{e9}", "invalid_key_or_value"),
            ("cmd=put kvsname=nope key=k value=v", "unknown_kvsname"),
        ] {
            let r = reply(c.handle(0, &msg(line)));
            assert_eq!(
                (r.cmd(), r.get("rc"), r.get("msg")),
                ("put_result", Some("-1"), Some(why))
            );
        }
        // The exact limits are accepted.
        let key = "k".repeat(KEYLEN_MAX);
        let value = "v".repeat(VALLEN_MAX);
        let r = reply(c.handle(0, &msg(&format!("cmd=put key={key} value={value}"))));
        assert_eq!(r.get("rc"), Some("0"));
        // Nothing refused was stored.
        let r = reply(c.handle(0, &msg("cmd=get key=PMI_anything")));
        assert_eq!(r.get("rc"), Some("-1"));
    }

    #[test]
    fn unknown_and_unsupported_commands_are_answered() {
        let mut c = core(1);
        let r = reply(c.handle(0, &msg("cmd=frobnicate x=1")));
        assert_eq!(
            r.to_line().unwrap(),
            "cmd=frobnicate_result rc=-1 msg=unknown_command\n"
        );
        let r = reply(c.handle(0, &msg("cmd=publish_name service=s port=p")));
        assert_eq!((r.cmd(), r.get("rc")), ("publish_result", Some("-1")));
        let spawn = Message::new("spawn").with("nprocs", "1").into_multiline();
        let r = reply(c.handle(0, &spawn));
        assert_eq!((r.cmd(), r.get("rc")), ("spawn_result", Some("-1")));
        // A command name that cannot be echoed closes the connection.
        assert!(matches!(
            c.handle(0, &msg("cmd=caf\u{e9}")),
            Action::Close { reply: None, .. }
        ));
        // And the session still works.
        assert_eq!(
            reply(c.handle(0, &msg("cmd=get_appnum"))).get("rc"),
            Some("0")
        );
    }

    #[test]
    fn barrier_holds_until_all_arrive() {
        let mut c = core(3);
        let b = msg("cmd=barrier_in");
        for round in 1..=2 {
            assert_eq!(c.handle(2, &b), Action::ReplyLater);
            assert_eq!(c.handle(0, &b), Action::ReplyLater);
            assert_eq!(c.barrier_epoch(), round - 1);
            // A rank in the barrier may not enter it again.
            assert!(matches!(
                c.handle(0, &b),
                Action::Close { reply: Some(_), .. }
            ));
            match c.handle(1, &b) {
                Action::Release { ranks, reply } => {
                    assert_eq!(ranks, vec![0, 1, 2]);
                    assert_eq!(reply.to_line().unwrap(), "cmd=barrier_out rc=0\n");
                }
                other => panic!("expected a release, got {other:?}"),
            }
            assert_eq!(c.barrier_epoch(), round);
        }
        let mut single = core(1);
        assert!(matches!(single.handle(0, &b), Action::Release { ranks, .. } if ranks == [0]));
    }

    #[test]
    fn finalize_abort_and_after() {
        let mut c = core(2);
        assert!(matches!(
            c.handle(1, &msg("cmd=abort exitcode=7 message=it_broke")),
            Action::Abort { rank: 1, code: 7, ref message } if message == "it_broke"
        ));
        assert!(matches!(
            c.handle(1, &msg("cmd=abort exitcode=x")),
            Action::Abort { code: 1, .. }
        ));
        match c.handle(0, &msg("cmd=finalize")) {
            Action::Finalized { reply } => {
                assert_eq!(reply.to_line().unwrap(), "cmd=finalize_ack rc=0\n");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            c.handle(0, &msg("cmd=get_appnum")),
            Action::Close { .. }
        ));
        assert!(matches!(
            c.handle(9, &msg("cmd=get_appnum")),
            Action::Close { reply: None, .. }
        ));
    }

    #[test]
    fn initack_handshake() {
        let mut c = core(2);
        match c.handle_initack(&msg("cmd=initack pmiid=1")) {
            Handshake::Accepted { rank, replies } => {
                assert_eq!(rank, 1);
                let lines: Vec<_> = replies.iter().map(|m| m.to_line().unwrap()).collect();
                assert_eq!(
                    lines,
                    [
                        "cmd=initack\n",
                        "cmd=set size=2\n",
                        "cmd=set rank=1\n",
                        "cmd=set debug=0\n"
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            "cmd=initack pmiid=1",
            "cmd=initack pmiid=2",
            "cmd=initack",
            "cmd=init",
        ] {
            match c.handle_initack(&msg(bad)) {
                Handshake::Rejected { reply, .. } => {
                    assert_eq!((reply.cmd(), reply.get("rc")), ("initack", Some("-1")));
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(
            c.attach(1),
            Err(ServerError::AlreadyConnected { rank: 1 })
        ));
        assert!(matches!(
            c.attach(2),
            Err(ServerError::RankOutOfRange { rank: 2, size: 2 })
        ));
        assert!(c.attach(0).is_ok());
        assert!(matches!(
            c.handle(0, &msg("cmd=initack pmiid=0")),
            Action::Close { .. }
        ));
    }

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

    #[test]
    fn malformed_line_closes_with_error_reply() {
        let mut c = core(1);
        let err = Message::parse(b"cmd=put key").unwrap_err();
        match c.handle_malformed(Some(0), &err) {
            Action::Close {
                reply: Some(reply),
                detail,
            } => {
                assert_eq!(reply.get("rc"), Some("-1"));
                assert!(detail.contains("rank 0"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
    }
}
