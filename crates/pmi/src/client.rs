//! The PMI-1 client: how a process started by udrun, `mpiexec.hydra` or
//! `srun --mpi=pmi2` learns its rank and exchanges addresses with its peers.
//!
//! Call order (each call blocks until the server replies):
//!
//! 1. [`PmiClient::from_env`] (or [`PmiClient::from_socket`] /
//!    [`PmiClient::new`] over any stream);
//! 2. [`init`](PmiClient::init), which also reads the limits, appnum,
//!    kvsname and universe size;
//! 3. [`put`](PmiClient::put) own values, [`barrier`](PmiClient::barrier),
//!    then [`get`](PmiClient::get) the peers' (puts are only guaranteed
//!    visible to other ranks after a barrier);
//! 4. [`finalize`](PmiClient::finalize), or [`abort`](PmiClient::abort).
//!
//! The barrier also comes in a nonblocking form, for a caller that must keep
//! doing other work (progressing a network transport) while it waits:
//! [`barrier_start`](PmiClient::barrier_start) sends `barrier_in`, then
//! [`barrier_poll`](PmiClient::barrier_poll) returns `Ok(false)` at once
//! until `barrier_out` has arrived:
//!
//! ```
//! # let mut pmi = udbtl_pmi::PmiClient::singleton();
//! # pmi.init()?;
//! # let progress = || {};
//! pmi.barrier_start()?;
//! while !pmi.barrier_poll()? {
//!     progress();
//! }
//! # Ok::<(), udbtl_pmi::PmiError>(())
//! ```
//!
//! # Port mode and the job secret
//!
//! With `PMI_PORT` the client connects over TCP. Without a secret
//! ([`PmiClient::connect_port`]) it speaks first, as with hydra:
//!
//! ```text
//! > cmd=initack pmiid=1
//! < cmd=initack
//! < cmd=set size=4
//! < cmd=set rank=1
//! < cmd=set debug=0
//! ```
//!
//! With the job secret ([`SECRET_ENV`], `UDBTL_PMI_SECRET`, in the
//! environment; or [`PmiClient::connect_port_authenticated`]) it waits for
//! the server's challenge and answers with a proof that it holds the secret
//! ([`JobSecret::proof`]):
//!
//! ```text
//! < cmd=challenge nonce=<64 hex digits>
//! > cmd=initack pmiid=1 proof=<64 hex digits>
//! < cmd=initack
//! < cmd=set size=4
//! < cmd=set rank=1
//! < cmd=set debug=0
//! ```
//!
//! Mismatches fail clearly: a client with a secret facing a server without
//! one gets no challenge and fails after [`CHALLENGE_TIMEOUT`] with
//! [`PmiError::NoChallenge`]; a client without one facing a server that
//! requires it fails at once with [`PmiError::SecretRequired`]; a wrong
//! secret gets [`PmiError::Failed`] with `msg` `authentication_failed`. A
//! server whose handshake slots are full closes new connections at once;
//! the authenticated client then reconnects for up to
//! [`PORT_RETRY_WINDOW`]. See the [server docs](crate::server) for the
//! server's side and what the secret does and does not protect.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::mem;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::thread;
use std::time::{Duration, Instant};

use tracing::{debug, trace};

use crate::auth::{self, JobSecret, NONCE_LEN, SECRET_ENV};
use crate::error::PmiError;
use crate::sys;
use crate::wire::{self, Message, ReadError, WireError};

/// Key prefix reserved for the launcher's own attributes.
pub const RESERVED_PREFIX: &str = "PMI_";

/// Separator between a [`put_long`](PmiClient::put_long) key and its chunk
/// index.
pub const LONG_SEP: char = '#';

/// How long an authenticated client
/// ([`connect_port_authenticated`](PmiClient::connect_port_authenticated))
/// waits for the server's challenge, and then for the rest of the
/// handshake. A server without a secret waits for the client's `initack`
/// and sends nothing, so against one the client fails after this long
/// with [`PmiError::NoChallenge`]. Below the server's
/// [`DEFAULT_HANDSHAKE_TIMEOUT`](crate::server::DEFAULT_HANDSHAKE_TIMEOUT).
pub const CHALLENGE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an authenticated client keeps reconnecting when the server
/// closes the connection before sending anything, which is what a server
/// does when [`PortOptions::with_max_handshakes`] connections are already
/// in their handshake (a flood of junk connections, say). Attempts are
/// spaced 10 ms apart at first, doubling up to 500 ms.
///
/// [`PortOptions::with_max_handshakes`]: crate::server::PortOptions::with_max_handshakes
pub const PORT_RETRY_WINDOW: Duration = Duration::from_secs(30);

/// The server's limits, from `get_maxes`. Each counts a C string's
/// terminating NUL, as MPICH does: the longest usable key is `key - 1`
/// bytes, the longest value `value - 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Maxes {
    /// `kvsname_max`.
    pub kvsname: usize,
    /// `keylen_max`.
    pub key: usize,
    /// `vallen_max`.
    pub value: usize,
}

impl Maxes {
    /// The limits udbtl's server advertises, also used in singleton mode
    /// (hydra and Slurm use the same).
    pub const DEFAULT: Self = Self {
        kvsname: 256,
        key: 64,
        value: 1024,
    };
}

/// How the client reaches its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// The inherited `PMI_FD` socket.
    Fd,
    /// A TCP connection to `PMI_PORT`, after the `initack` handshake.
    Port,
    /// A caller-supplied stream ([`PmiClient::new`]).
    Stream,
    /// No launcher: rank 0 of 1 with an in-memory key-value space.
    Singleton,
}

/// A PMI-1 client.
///
/// Not thread-safe by design (PMI-1 is a strict request/reply protocol):
/// share it behind a `Mutex` if several threads need it.
pub struct PmiClient {
    rank: u32,
    size: u32,
    mode: Mode,
    link: Link,
    state: State,
    job: Option<Job>,
    /// Between [`barrier_start`](Self::barrier_start) and the end of the
    /// barrier reported by [`barrier_poll`](Self::barrier_poll).
    barrier_in_flight: bool,
}

/// Where requests go.
enum Link {
    Remote(Conn),
    Singleton(HashMap<String, String>),
}

/// A connection to a PMI server.
struct Conn {
    io: Io,
    /// The start of a reply line that [`Conn::try_recv`] has taken out of
    /// the reader while its `\n` had not arrived yet. Empty between
    /// requests.
    partial: Vec<u8>,
}

/// How a connection is read and written.
enum Io {
    /// A socket: replies are read through the buffer, requests written to
    /// the socket itself (`get_mut`), and readiness can be asked of poll(2),
    /// so a reply can be waited for without blocking.
    Socket(BufReader<Box<dyn Socket>>),
    /// Halves given by the caller ([`PmiClient::new`]): blocking reads only.
    Split {
        reader: Box<dyn BufRead + Send>,
        writer: Box<dyn Write + Send>,
    },
}

/// A connected stream socket, read and written through one handle.
trait Socket: Read + Write + AsFd + Send {}

impl<T: Read + Write + AsFd + Send> Socket for T {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Created,
    Ready,
    Finalized,
}

/// What `init` learnt.
#[derive(Debug, Clone)]
struct Job {
    kvsname: String,
    maxes: Maxes,
    appnum: Option<u32>,
    universe_size: Option<u32>,
}

impl PmiClient {
    /// Finds the launcher from the process environment; see
    /// [`from_env_with`](Self::from_env_with).
    ///
    /// # Errors
    ///
    /// As [`from_env_with`](Self::from_env_with).
    pub fn from_env() -> Result<Self, PmiError> {
        Self::from_env_with(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Finds the launcher from the variables `lookup` returns:
    ///
    /// 1. `PMI_FD` set: take ownership of that inherited socket (at most once
    ///    per process; it is made close-on-exec) with rank `PMI_RANK` and
    ///    size `PMI_SIZE` (both required);
    /// 2. else `PMI_PORT=host:port` and `PMI_ID` set:
    ///    [`connect_port_authenticated`](Self::connect_port_authenticated)
    ///    if [`SECRET_ENV`] (`UDBTL_PMI_SECRET`) holds the job secret (64 hex
    ///    digits), else [`connect_port`](Self::connect_port);
    /// 3. else `PMIX_RANK`, `PMIX_VERSION` or `PRTE_LAUNCHED` set: a PMIx
    ///    launcher, which is refused;
    /// 4. else [`singleton`](Self::singleton).
    ///
    /// No request is sent except the `initack` handshake of `PMI_PORT`: call
    /// [`init`](Self::init) next.
    ///
    /// # Errors
    ///
    /// [`PmiError::Env`] for a missing or invalid variable (an invalid
    /// secret is not quoted),
    /// [`PmiError::InheritedFd`] if `PMI_FD` is not an open socket (or was
    /// already taken), [`PmiError::PmixLauncher`], and the errors of
    /// [`connect_port`](Self::connect_port) or
    /// [`connect_port_authenticated`](Self::connect_port_authenticated).
    pub fn from_env_with(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, PmiError> {
        if let Some(fd) = lookup("PMI_FD") {
            let fd = parse_env::<i32>("PMI_FD", &fd)?;
            let rank = required_env(&lookup, "PMI_RANK")?;
            let size = required_env(&lookup, "PMI_SIZE")?;
            check_rank("PMI_RANK", rank, size)?;
            let stream = sys::take_inherited_socket(fd)
                .map_err(|source| PmiError::InheritedFd { fd, source })?;
            debug!(fd, rank, size, "PMI client on PMI_FD");
            let mut client = Self::from_socket(stream, rank, size)?;
            client.mode = Mode::Fd;
            return Ok(client);
        }
        if let Some(port) = lookup("PMI_PORT") {
            let Some(id) = lookup("PMI_ID") else {
                return Err(PmiError::Env {
                    var: "PMI_ID",
                    reason: "not set (PMI_PORT is)".into(),
                });
            };
            return match lookup(SECRET_ENV) {
                Some(hex) => {
                    let secret = JobSecret::from_hex(&hex).map_err(|e| PmiError::Env {
                        var: SECRET_ENV,
                        reason: e.to_string(),
                    })?;
                    Self::connect_port_authenticated(&port, &id, &secret)
                }
                None => Self::connect_port(&port, &id),
            };
        }
        for var in ["PMIX_RANK", "PMIX_VERSION", "PRTE_LAUNCHED"] {
            if lookup(var).is_some() {
                return Err(PmiError::PmixLauncher { var });
            }
        }
        debug!("no PMI launcher found: singleton");
        Ok(Self::singleton())
    }

    /// A client over an established connection: replies are read from
    /// `reader`, requests written to `writer` (flushed after each one).
    ///
    /// Such a client cannot wait for a reply without blocking, so its
    /// [`barrier_start`](Self::barrier_start) fails with
    /// [`PmiError::NotPollable`]: use [`from_socket`](Self::from_socket) for
    /// the nonblocking barrier.
    ///
    /// # Errors
    ///
    /// [`PmiError::Env`] (naming `PMI_RANK`) if `rank >= size`.
    pub fn new(
        reader: impl BufRead + Send + 'static,
        writer: impl Write + Send + 'static,
        rank: u32,
        size: u32,
    ) -> Result<Self, PmiError> {
        check_rank("PMI_RANK", rank, size)?;
        let io = Io::Split {
            reader: Box::new(reader),
            writer: Box::new(writer),
        };
        Ok(Self::with_link(
            Link::Remote(Conn::new(io)),
            Mode::Stream,
            rank,
            size,
        ))
    }

    /// A client over a connected, blocking stream socket (such as a
    /// `UnixStream` or a `TcpStream`), which it both reads (buffered) and
    /// writes. Unlike [`new`](Self::new), the client can ask the socket
    /// whether a reply has arrived, so it supports the nonblocking
    /// [`barrier_start`](Self::barrier_start) /
    /// [`barrier_poll`](Self::barrier_poll). The clients of
    /// [`from_env`](Self::from_env) are built this way.
    ///
    /// # Errors
    ///
    /// [`PmiError::Env`] (naming `PMI_RANK`) if `rank >= size`.
    pub fn from_socket(
        socket: impl Read + Write + AsFd + Send + 'static,
        rank: u32,
        size: u32,
    ) -> Result<Self, PmiError> {
        check_rank("PMI_RANK", rank, size)?;
        let socket: Box<dyn Socket> = Box::new(socket);
        let io = Io::Socket(BufReader::new(socket));
        Ok(Self::with_link(
            Link::Remote(Conn::new(io)),
            Mode::Stream,
            rank,
            size,
        ))
    }

    /// A client with no server: rank 0 of 1, whose `put`/`get` use an
    /// in-memory key-value space and whose `barrier` returns at once.
    pub fn singleton() -> Self {
        Self::with_link(Link::Singleton(HashMap::new()), Mode::Singleton, 0, 1)
    }

    /// Connects to a PMI server in port mode (`PMI_PORT=host:port`,
    /// `PMI_ID=pmiid`) and does the handshake: sends `cmd=initack
    /// pmiid=<pmiid>`, expects `cmd=initack`, then `cmd=set` lines giving
    /// `size`, `rank` and `debug` in any order (other `set` keys are
    /// ignored).
    ///
    /// # Errors
    ///
    /// [`PmiError::Env`] if `addr` is not `host:port`, [`PmiError::Connect`],
    /// and the errors of any request (with `cmd` `"initack"`).
    pub fn connect_port(addr: &str, pmiid: &str) -> Result<Self, PmiError> {
        let (host, port) = split_host_port(addr)?;
        let connect_err = |source| PmiError::Connect {
            addr: addr.to_owned(),
            source,
        };
        let stream = TcpStream::connect((host, port)).map_err(connect_err)?;
        stream.set_nodelay(true).map_err(connect_err)?;
        let socket: Box<dyn Socket> = Box::new(stream);
        let mut conn = Conn::new(Io::Socket(BufReader::new(socket)));
        let (rank, size) = conn.initack(pmiid, None)?;
        check_rank("PMI_ID", rank, size)?;
        debug!(addr, pmiid, rank, size, "PMI client on PMI_PORT");
        Ok(Self::with_link(Link::Remote(conn), Mode::Port, rank, size))
    }

    /// Connects to a PMI server that requires the job secret (see the
    /// [server docs](crate::server#authenticated-port-mode)): reads the
    /// server's `cmd=challenge nonce=<hex>`, sends `cmd=initack
    /// pmiid=<pmiid> proof=<hex>` with [`JobSecret::proof`], then reads the
    /// replies as [`connect_port`](Self::connect_port) does.
    ///
    /// The whole handshake must be done within [`CHALLENGE_TIMEOUT`]. If the
    /// server closes the connection before sending anything (it does so
    /// while its handshake slots are full), the client connects again, for
    /// up to [`PORT_RETRY_WINDOW`].
    ///
    /// # Errors
    ///
    /// As [`connect_port`](Self::connect_port), and
    /// [`PmiError::NoChallenge`] if no challenge came in time (the server
    /// does not require a secret), [`PmiError::ClosedBeforeChallenge`] if
    /// the server kept closing the connection, or [`PmiError::Failed`]
    /// (`cmd` `"initack"`, `msg=authentication_failed`) if the server
    /// refused the proof (the secret is not this job's).
    pub fn connect_port_authenticated(
        addr: &str,
        pmiid: &str,
        secret: &JobSecret,
    ) -> Result<Self, PmiError> {
        const CMD: &str = "initack";
        let (host, port) = split_host_port(addr)?;
        let connect_err = |source| PmiError::Connect {
            addr: addr.to_owned(),
            source,
        };
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        let mut attempts = 0u32;
        let (mut conn, stream, challenge) = loop {
            attempts += 1;
            let stream = TcpStream::connect((host, port)).map_err(connect_err)?;
            stream
                .set_nodelay(true)
                .and_then(|()| stream.set_read_timeout(Some(CHALLENGE_TIMEOUT)))
                .and_then(|()| stream.set_write_timeout(Some(CHALLENGE_TIMEOUT)))
                .map_err(connect_err)?;
            // Shares the socket, to lift the timeouts after the handshake.
            let handle = stream.try_clone().map_err(connect_err)?;
            let socket: Box<dyn Socket> = Box::new(stream);
            let mut conn = Conn::new(Io::Socket(BufReader::new(socket)));
            match conn.recv(CMD) {
                Ok(challenge) => break (conn, handle, challenge),
                Err(PmiError::Io { source, .. })
                    if matches!(
                        source.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(PmiError::NoChallenge {
                        addr: addr.to_owned(),
                        waited: CHALLENGE_TIMEOUT,
                    });
                }
                Err(e) if closed_early(&e) => {
                    if start.elapsed() + pause > PORT_RETRY_WINDOW {
                        return Err(PmiError::ClosedBeforeChallenge {
                            addr: addr.to_owned(),
                            attempts,
                            window: PORT_RETRY_WINDOW,
                        });
                    }
                    debug!(
                        addr,
                        attempts, "PMI server closed before its challenge; retrying"
                    );
                    thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        };
        let challenge = check_reply(CMD, "challenge", challenge)?;
        let nonce_hex = required_field(CMD, &challenge, "nonce")?;
        let nonce = auth::decode_hex::<NONCE_LEN>(nonce_hex).ok_or_else(|| PmiError::BadField {
            cmd: CMD,
            field: "nonce",
            value: wire::snippet(nonce_hex),
        })?;
        let proof = auth::encode_hex(&secret.proof(&nonce, pmiid));
        let (rank, size) = conn.initack(pmiid, Some(&proof))?;
        check_rank("PMI_ID", rank, size)?;
        stream
            .set_read_timeout(None)
            .and_then(|()| stream.set_write_timeout(None))
            .map_err(|source| PmiError::Io { cmd: CMD, source })?;
        debug!(
            addr,
            pmiid, rank, size, attempts, "PMI client on PMI_PORT, authenticated"
        );
        Ok(Self::with_link(Link::Remote(conn), Mode::Port, rank, size))
    }

    fn with_link(link: Link, mode: Mode, rank: u32, size: u32) -> Self {
        Self {
            rank,
            size,
            mode,
            link,
            state: State::Created,
            job: None,
            barrier_in_flight: false,
        }
    }

    /// This process's rank, `0..size`.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of processes in the job.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// How this client reaches its server.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether there is no server (see [`singleton`](Self::singleton)).
    pub fn is_singleton(&self) -> bool {
        self.mode == Mode::Singleton
    }

    /// The job's key-value space name; `None` before [`init`](Self::init).
    pub fn kvsname(&self) -> Option<&str> {
        self.job.as_ref().map(|j| j.kvsname.as_str())
    }

    /// The server's limits; `None` before [`init`](Self::init).
    pub fn maxes(&self) -> Option<Maxes> {
        self.job.as_ref().map(|j| j.maxes)
    }

    /// The application number (MPMD); `None` before `init` or when the
    /// launcher does not tell (Slurm answers -1).
    pub fn appnum(&self) -> Option<u32> {
        self.job.as_ref().and_then(|j| j.appnum)
    }

    /// The universe size; `None` before `init` or when the launcher does not
    /// tell (hydra answers -1).
    pub fn universe_size(&self) -> Option<u32> {
        self.job.as_ref().and_then(|j| j.universe_size)
    }

    /// Initialises the session: `init pmi_version=1 pmi_subversion=1`, then
    /// `get_maxes`, `get_appnum`, `get_my_kvsname`, `get_universe_size`.
    ///
    /// # Errors
    ///
    /// [`PmiError::State`] if called twice or after `finalize`; any error of
    /// a request; [`PmiError::BadField`] if the server speaks another PMI
    /// version or sends unparsable limits.
    pub fn init(&mut self) -> Result<(), PmiError> {
        if self.state != State::Created {
            return Err(PmiError::State {
                cmd: "init",
                state: self.state_name(),
            });
        }
        let job = match &mut self.link {
            Link::Singleton(_) => Job {
                kvsname: format!("singleton_kvs_{}", std::process::id()),
                maxes: Maxes::DEFAULT,
                appnum: Some(0),
                universe_size: Some(1),
            },
            Link::Remote(conn) => conn.init()?,
        };
        debug!(rank = self.rank, kvsname = %job.kvsname, maxes = ?job.maxes, "PMI initialised");
        self.job = Some(job);
        self.state = State::Ready;
        Ok(())
    }

    /// Stores `value` under `key` in the job's key-value space. Other ranks
    /// are only guaranteed to see it after a [`barrier`](Self::barrier).
    ///
    /// `key` must be printable ASCII without space or `=`, shorter than
    /// [`Maxes::key`], and not start with `PMI_`; `value` printable ASCII
    /// without space (store binary data as hex), shorter than
    /// [`Maxes::value`] (use [`put_long`](Self::put_long) beyond).
    ///
    /// # Errors
    ///
    /// [`PmiError::InvalidKey`], [`PmiError::InvalidValue`],
    /// [`PmiError::State`] outside `init`..`finalize`, or the server's
    /// refusal ([`PmiError::Failed`]) and transport errors.
    pub fn put(&mut self, key: &str, value: &str) -> Result<(), PmiError> {
        let job = self.ready("put")?;
        check_put_key(key, job.maxes)?;
        check_value(key, value, job.maxes)?;
        let kvsname = job.kvsname.clone();
        match &mut self.link {
            Link::Singleton(kvs) => {
                kvs.insert(key.to_owned(), value.to_owned());
                Ok(())
            }
            Link::Remote(conn) => {
                let req = Message::new("put")
                    .with("kvsname", kvsname)
                    .with("key", key)
                    .with("value", value);
                let reply = conn.call("put", &req, "put_result")?;
                check_rc("put", &reply)
            }
        }
    }

    /// Reads `key` from the job's key-value space; `Ok(None)` if it is not
    /// there. A reply with any non-zero `rc` means "not found" (hydra
    /// answers `rc=-1 msg=key_<key>_not_found value=unknown`, Slurm `rc=1`
    /// with no value), as does `found=FALSE`. Keys starting with `PMI_` are
    /// the launcher's attributes, e.g. `PMI_process_mapping`.
    ///
    /// # Errors
    ///
    /// [`PmiError::InvalidKey`], [`PmiError::State`], transport errors, and
    /// [`PmiError::MissingField`] for a success reply without `value`.
    pub fn get(&mut self, key: &str) -> Result<Option<String>, PmiError> {
        let job = self.ready("get")?;
        check_key(key, job.maxes)?;
        let kvsname = job.kvsname.clone();
        match &mut self.link {
            Link::Singleton(kvs) => Ok(match key {
                "PMI_process_mapping" => Some("(vector,(0,1,1))".to_owned()),
                _ => kvs.get(key).cloned(),
            }),
            Link::Remote(conn) => {
                let req = Message::new("get")
                    .with("kvsname", kvsname)
                    .with("key", key);
                let reply = conn.call("get", &req, "get_result")?;
                let rc = rc_of("get", &reply)?;
                let found = reply
                    .get("found")
                    .is_none_or(|f| f.eq_ignore_ascii_case("true"));
                if rc != 0 || !found {
                    trace!(key, rc, "PMI key not found");
                    return Ok(None);
                }
                match reply.get("value") {
                    Some(v) => Ok(Some(v.to_owned())),
                    None => Err(PmiError::MissingField {
                        cmd: "get",
                        field: "value",
                    }),
                }
            }
        }
    }

    /// Stores a value of any length: [`put`](Self::put) of `key` holding
    /// `<n>:<chunk 0>`, where `n` is the number of chunks, and of
    /// `key#1`..`key#<n-1>` holding the others, each chunk as long as the
    /// server's value limit allows. Read it back with
    /// [`get_long`](Self::get_long) (only). Same rules as `put` for `value`;
    /// `key#<n-1>` must fit the key limit.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put); nothing is stored if a key or the value is
    /// invalid.
    pub fn put_long(&mut self, key: &str, value: &str) -> Result<(), PmiError> {
        let job = self.ready("put")?;
        let maxes = job.maxes;
        check_put_key(key, maxes)?;
        if !wire::is_valid_value(value) {
            return Err(invalid_value(key, "holds a space or a non-printable byte"));
        }
        let cap = maxes.value.saturating_sub(1);
        let count = chunk_count(value.len(), cap)
            .ok_or_else(|| invalid_value(key, &format!("value limit {cap} too small to chunk")))?;
        let last = long_key(key, count - 1);
        if count > 1 && last.len() >= maxes.key {
            return Err(PmiError::InvalidKey {
                key: wire::snippet(key),
                reason: format!(
                    "chunk key {last:?} of {count} chunks exceeds the key limit {}",
                    maxes.key
                ),
            });
        }
        let header = format!("{count}:");
        let (first, mut rest) = value.split_at(value.len().min(cap - header.len()));
        self.put(key, &format!("{header}{first}"))?;
        for index in 1..count {
            let (chunk, tail) = rest.split_at(rest.len().min(cap));
            self.put(&long_key(key, index), chunk)?;
            rest = tail;
        }
        Ok(())
    }

    /// Reads a value stored by [`put_long`](Self::put_long); `Ok(None)` if
    /// `key` is not there.
    ///
    /// # Errors
    ///
    /// [`PmiError::LongValue`] if the header is malformed or a chunk is
    /// missing, and the errors of [`get`](Self::get).
    pub fn get_long(&mut self, key: &str) -> Result<Option<String>, PmiError> {
        let Some(first) = self.get(key)? else {
            return Ok(None);
        };
        let bad = |reason: String| PmiError::LongValue {
            key: wire::snippet(key),
            reason,
        };
        let (count, chunk) = first
            .split_once(':')
            .and_then(|(n, chunk)| Some((n.parse::<usize>().ok().filter(|&n| n > 0)?, chunk)))
            .ok_or_else(|| bad("no <count>: header (was it stored by put_long?)".into()))?;
        let mut value = String::with_capacity(chunk.len().saturating_mul(count.min(1 << 16)));
        value.push_str(chunk);
        for index in 1..count {
            match self.get(&long_key(key, index))? {
                Some(chunk) => value.push_str(&chunk),
                None => return Err(bad(format!("chunk {index} of {count} is missing"))),
            }
        }
        Ok(Some(value))
    }

    /// Waits until every rank has entered the barrier (`barrier_in` →
    /// `barrier_out`). Returns at once in singleton mode.
    ///
    /// This is [`barrier_start`](Self::barrier_start) followed by a blocking
    /// read of the reply; it works on every client, including those of
    /// [`new`](Self::new).
    ///
    /// # Errors
    ///
    /// [`PmiError::State`], [`PmiError::BarrierInFlight`] if a barrier
    /// started by `barrier_start` is not over, transport errors, or a
    /// non-zero `rc`.
    pub fn barrier(&mut self) -> Result<(), PmiError> {
        self.ready("barrier_in")?;
        match &mut self.link {
            Link::Singleton(_) => Ok(()),
            Link::Remote(conn) => {
                let reply = conn.call("barrier_in", &Message::new("barrier_in"), "barrier_out")?;
                check_rc("barrier_in", &reply)
            }
        }
    }

    /// Enters the barrier without waiting for the others: sends `barrier_in`
    /// and returns. Follow it with [`barrier_poll`](Self::barrier_poll)
    /// until that returns `Ok(true)` (or an error); until then every other
    /// request but [`abort`](Self::abort) fails with
    /// [`PmiError::BarrierInFlight`]. In singleton mode nothing is sent and
    /// the first `barrier_poll` returns `Ok(true)`.
    ///
    /// # Errors
    ///
    /// [`PmiError::State`] outside `init`..`finalize`,
    /// [`PmiError::BarrierInFlight`] if a barrier is already in flight,
    /// [`PmiError::NotPollable`] for a client of [`new`](Self::new) (which
    /// only has the blocking [`barrier`](Self::barrier)), or the error of
    /// writing the request (the barrier is then not in flight).
    pub fn barrier_start(&mut self) -> Result<(), PmiError> {
        self.ready("barrier_in")?;
        if let Link::Remote(conn) = &mut self.link {
            if !conn.is_pollable() {
                return Err(PmiError::NotPollable);
            }
            conn.send("barrier_in", &Message::new("barrier_in"))?;
        }
        trace!(rank = self.rank, "PMI barrier started");
        self.barrier_in_flight = true;
        Ok(())
    }

    /// Whether the barrier started by [`barrier_start`](Self::barrier_start)
    /// is over, without blocking: `Ok(true)` once every rank has entered it
    /// (`barrier_out` arrived; the client is then ready for other requests),
    /// `Ok(false)` if not yet.
    ///
    /// It looks at the bytes already buffered first, then asks the socket
    /// with a zero-timeout poll(2) and reads only when that says a read will
    /// not block. A reply that arrives in pieces is kept until its `\n`
    /// comes: a partial line never makes this call wait.
    ///
    /// # Errors
    ///
    /// [`PmiError::NoBarrierInFlight`] without a barrier in flight; for the
    /// reply, the errors of [`barrier`](Self::barrier), among them
    /// [`PmiError::Eof`] or [`PmiError::Malformed`] (`Truncated`) if the
    /// server closes the connection, and [`PmiError::Failed`] for a non-zero
    /// `rc`. Any error ends the barrier.
    pub fn barrier_poll(&mut self) -> Result<bool, PmiError> {
        if !self.barrier_in_flight {
            return Err(PmiError::NoBarrierInFlight);
        }
        let Link::Remote(conn) = &mut self.link else {
            self.barrier_in_flight = false;
            return Ok(true);
        };
        let outcome = match conn.try_recv("barrier_in") {
            Ok(None) => return Ok(false),
            Ok(Some(reply)) => check_reply("barrier_in", "barrier_out", reply)
                .and_then(|reply| check_rc("barrier_in", &reply)),
            Err(e) => Err(e),
        };
        // A reply, or an error: the barrier is over either way.
        self.barrier_in_flight = false;
        conn.partial.clear();
        trace!(rank = self.rank, ok = outcome.is_ok(), "PMI barrier over");
        outcome.map(|()| true)
    }

    /// Ends the session (`finalize` → `finalize_ack`). Later calls fail with
    /// [`PmiError::State`]; dropping the client then closes the connection.
    ///
    /// # Errors
    ///
    /// [`PmiError::State`] outside `init`..`finalize`, transport errors, or
    /// a non-zero `rc`.
    pub fn finalize(&mut self) -> Result<(), PmiError> {
        self.ready("finalize")?;
        if let Link::Remote(conn) = &mut self.link {
            let reply = conn.call("finalize", &Message::new("finalize"), "finalize_ack")?;
            check_rc("finalize", &reply)?;
        }
        self.state = State::Finalized;
        debug!(rank = self.rank, "PMI finalized");
        Ok(())
    }

    /// Asks the launcher to kill the job with exit code `code`: sends
    /// `cmd=abort exitcode=<code> message=<message>` (bytes other than
    /// printable ASCII, spaces included, become `_`; at most 1023 bytes) and
    /// returns without waiting for a reply. Allowed in any state, even with a
    /// barrier in flight (udbtl's own server only reads it once that barrier
    /// is released or the connection closes); does nothing in singleton
    /// mode. This does not exit the process: the caller should exit with
    /// `code` next.
    ///
    /// # Errors
    ///
    /// [`PmiError::Io`] if the request could not be written.
    pub fn abort(&mut self, code: i32, message: &str) -> Result<(), PmiError> {
        let Link::Remote(conn) = &mut self.link else {
            return Ok(());
        };
        let mut text: String = message
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .take(1023)
            .collect();
        if text.is_empty() {
            text.push('_');
        }
        debug!(rank = self.rank, code, message = %text, "PMI abort");
        let req = Message::new("abort")
            .with("exitcode", code.to_string())
            .with("message", text);
        conn.send("abort", &req)
    }

    /// The job learnt by `init`, if the client is between `init` and
    /// `finalize` and no barrier is in flight.
    fn ready(&self, cmd: &'static str) -> Result<&Job, PmiError> {
        match (&self.job, self.state) {
            (Some(_), State::Ready) if self.barrier_in_flight => {
                Err(PmiError::BarrierInFlight { cmd })
            }
            (Some(job), State::Ready) => Ok(job),
            _ => Err(PmiError::State {
                cmd,
                state: self.state_name(),
            }),
        }
    }

    fn state_name(&self) -> &'static str {
        match self.state {
            State::Created => "before init",
            State::Ready => "after init",
            State::Finalized => "after finalize",
        }
    }
}

impl fmt::Debug for PmiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PmiClient")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("mode", &self.mode)
            .field("state", &self.state)
            .field("barrier_in_flight", &self.barrier_in_flight)
            .field("kvsname", &self.kvsname())
            .finish_non_exhaustive()
    }
}

impl Conn {
    fn new(io: Io) -> Self {
        Self {
            io,
            partial: Vec::new(),
        }
    }

    /// Whether [`try_recv`](Self::try_recv) can be used.
    fn is_pollable(&self) -> bool {
        matches!(self.io, Io::Socket(_))
    }

    /// Writes one request and flushes it.
    fn send(&mut self, cmd: &'static str, req: &Message) -> Result<(), PmiError> {
        let line = req
            .to_line()
            .map_err(|source| PmiError::Encode { cmd, source })?;
        trace!(request = line.trim_end(), "PMI >");
        let writer: &mut dyn Write = match &mut self.io {
            Io::Socket(reader) => reader.get_mut(),
            Io::Split { writer, .. } => writer,
        };
        writer
            .write_all(line.as_bytes())
            .and_then(|()| writer.flush())
            .map_err(|source| PmiError::Io { cmd, source })
    }

    /// Reads one reply to `cmd`, blocking until it arrives.
    fn recv(&mut self, cmd: &'static str) -> Result<Message, PmiError> {
        // Only barrier_poll leaves bytes here, and only while a barrier is in
        // flight, when no blocking request is allowed.
        debug_assert!(
            self.partial.is_empty(),
            "blocking read after a partial line"
        );
        let reader: &mut dyn BufRead = match &mut self.io {
            Io::Socket(reader) => reader,
            Io::Split { reader, .. } => reader,
        };
        decode(cmd, wire::read_message(reader))
    }

    /// Reads one reply to `cmd` if all of its line has arrived, without
    /// blocking: `Ok(None)` if not yet.
    ///
    /// The bytes already in the reader's buffer are used first, so a reply
    /// that came in with an earlier one is not missed; only an empty buffer
    /// makes it poll the socket, and it reads only when poll(2) says a read
    /// returns at once (one `read` per refill, as `BufReader::fill_buf` does
    /// on an empty buffer). The start of a line whose `\n` has not arrived
    /// is moved to `partial`, so the buffer is always empty before a poll.
    fn try_recv(&mut self, cmd: &'static str) -> Result<Option<Message>, PmiError> {
        let Io::Socket(reader) = &mut self.io else {
            return Err(PmiError::NotPollable);
        };
        loop {
            let buffered = reader.buffer();
            if let Some(end) = buffered.iter().position(|&b| b == b'\n') {
                self.partial.extend_from_slice(&buffered[..=end]);
                reader.consume(end + 1);
                let line = mem::take(&mut self.partial);
                return decode(cmd, wire::read_message(&mut line.as_slice())).map(Some);
            }
            let taken = buffered.len();
            self.partial.extend_from_slice(buffered);
            reader.consume(taken);
            if self.partial.len() > wire::MAX_LINE {
                return Err(PmiError::Malformed {
                    cmd,
                    source: WireError::LineTooLong {
                        max: wire::MAX_LINE,
                    },
                });
            }
            let fd = reader.get_ref().as_fd();
            if !sys::readable_now(fd).map_err(|source| PmiError::Io { cmd, source })? {
                return Ok(None);
            }
            match reader.fill_buf() {
                Ok([]) if self.partial.is_empty() => return Err(PmiError::Eof { cmd }),
                Ok([]) => {
                    return Err(PmiError::Malformed {
                        cmd,
                        source: WireError::Truncated,
                    });
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(PmiError::Io { cmd, source }),
            }
        }
    }

    /// Sends `req` and reads its reply, which must be `expected`.
    fn call(
        &mut self,
        cmd: &'static str,
        req: &Message,
        expected: &'static str,
    ) -> Result<Message, PmiError> {
        self.send(cmd, req)?;
        self.expect(cmd, expected)
    }

    fn expect(&mut self, cmd: &'static str, expected: &'static str) -> Result<Message, PmiError> {
        let reply = self.recv(cmd)?;
        check_reply(cmd, expected, reply)
    }

    /// The `PMI_PORT` handshake, with the proof of authenticated mode;
    /// returns `(rank, size)`.
    fn initack(&mut self, pmiid: &str, proof: Option<&str>) -> Result<(u32, u32), PmiError> {
        const CMD: &str = "initack";
        let mut req = Message::new(CMD).with("pmiid", pmiid);
        if let Some(proof) = proof {
            req = req.with("proof", proof);
        }
        self.send(CMD, &req)?;
        let reply = self.recv(CMD)?;
        if reply.cmd() == "challenge" && proof.is_none() {
            return Err(PmiError::SecretRequired);
        }
        let reply = check_reply(CMD, CMD, reply)?;
        check_rc(CMD, &reply)?;
        let (mut rank, mut size, mut debug) = (None, None, None);
        while rank.is_none() || size.is_none() || debug.is_none() {
            let set = self.expect(CMD, "set")?;
            for (key, value) in set.args() {
                match key.as_str() {
                    "rank" => rank = Some(parse_field::<u32>(CMD, "rank", value)?),
                    "size" => size = Some(parse_field::<u32>(CMD, "size", value)?),
                    "debug" => debug = Some(parse_field::<i64>(CMD, "debug", value)?),
                    _ => trace!(key, value, "ignoring PMI set"),
                }
            }
        }
        match (rank, size) {
            (Some(rank), Some(size)) => Ok((rank, size)),
            _ => Err(PmiError::MissingField {
                cmd: CMD,
                field: "rank",
            }),
        }
    }

    fn init(&mut self) -> Result<Job, PmiError> {
        let req = Message::new("init")
            .with("pmi_version", "1")
            .with("pmi_subversion", "1");
        let reply = self.call("init", &req, "response_to_init")?;
        check_rc("init", &reply)?;
        if let Some(v) = reply.get("pmi_version").filter(|&v| v != "1") {
            return Err(PmiError::BadField {
                cmd: "init",
                field: "pmi_version",
                value: wire::snippet(v),
            });
        }

        let reply = self.call("get_maxes", &Message::new("get_maxes"), "maxes")?;
        check_rc("get_maxes", &reply)?;
        let limit = |field| {
            let v = required_field("get_maxes", &reply, field)?;
            match parse_field::<usize>("get_maxes", field, v)? {
                n if n >= 2 => Ok(n),
                _ => Err(PmiError::BadField {
                    cmd: "get_maxes",
                    field,
                    value: wire::snippet(v),
                }),
            }
        };
        let maxes = Maxes {
            kvsname: limit("kvsname_max")?,
            key: limit("keylen_max")?,
            value: limit("vallen_max")?,
        };

        let reply = self.call("get_appnum", &Message::new("get_appnum"), "appnum")?;
        check_rc("get_appnum", &reply)?;
        let appnum = optional_count("get_appnum", "appnum", &reply)?;

        let reply = self.call(
            "get_my_kvsname",
            &Message::new("get_my_kvsname"),
            "my_kvsname",
        )?;
        check_rc("get_my_kvsname", &reply)?;
        let kvsname = required_field("get_my_kvsname", &reply, "kvsname")?.to_owned();
        if !wire::is_valid_value(&kvsname) || kvsname.is_empty() {
            return Err(PmiError::BadField {
                cmd: "get_my_kvsname",
                field: "kvsname",
                value: wire::snippet(&kvsname),
            });
        }

        let reply = self.call(
            "get_universe_size",
            &Message::new("get_universe_size"),
            "universe_size",
        )?;
        check_rc("get_universe_size", &reply)?;
        let universe_size = optional_count("get_universe_size", "size", &reply)?;

        Ok(Job {
            kvsname,
            maxes,
            appnum,
            universe_size,
        })
    }
}

/// The outcome of [`wire::read_message`] for a reply to `cmd`.
fn decode(
    cmd: &'static str,
    read: Result<Option<Message>, ReadError>,
) -> Result<Message, PmiError> {
    match read {
        Ok(Some(reply)) => {
            trace!(reply = %reply, "PMI <");
            Ok(reply)
        }
        Ok(None) => Err(PmiError::Eof { cmd }),
        Err(ReadError::Io(source)) if source.kind() == io::ErrorKind::UnexpectedEof => {
            Err(PmiError::Eof { cmd })
        }
        Err(ReadError::Io(source)) => Err(PmiError::Io { cmd, source }),
        Err(ReadError::Malformed(source)) => Err(PmiError::Malformed { cmd, source }),
    }
}

/// Whether `e` says the server closed the connection without a word (an
/// end of stream or a reset before the first line).
fn closed_early(e: &PmiError) -> bool {
    match e {
        PmiError::Eof { .. } => true,
        PmiError::Io { source, .. } => matches!(
            source.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// `reply`, if it is an `expected` message.
fn check_reply(
    cmd: &'static str,
    expected: &'static str,
    reply: Message,
) -> Result<Message, PmiError> {
    if reply.cmd() != expected {
        return Err(PmiError::UnexpectedReply {
            cmd,
            expected,
            got: wire::snippet(&reply.to_string()),
        });
    }
    Ok(reply)
}

/// Number of chunks `put_long` needs for `len` bytes when a value holds at
/// most `cap` bytes and the first carries the `<n>:` header. `None` if `cap`
/// cannot even hold a header and one byte.
fn chunk_count(len: usize, cap: usize) -> Option<usize> {
    let mut count = 1usize;
    loop {
        let header = decimal_len(count) + 1;
        let first = cap.checked_sub(header).filter(|&c| c > 0)?;
        if len <= first.saturating_add((count - 1).saturating_mul(cap)) {
            return Some(count);
        }
        count += 1;
    }
}

fn decimal_len(n: usize) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn long_key(key: &str, index: usize) -> String {
    if index == 0 {
        key.to_owned()
    } else {
        format!("{key}{LONG_SEP}{index}")
    }
}

/// The reply's `rc`; 0 when absent (hydra's `barrier_out` has none).
fn rc_of(cmd: &'static str, reply: &Message) -> Result<i64, PmiError> {
    reply
        .get("rc")
        .map_or(Ok(0), |rc| parse_field(cmd, "rc", rc))
}

fn check_rc(cmd: &'static str, reply: &Message) -> Result<(), PmiError> {
    match rc_of(cmd, reply)? {
        0 => Ok(()),
        rc => Err(PmiError::Failed {
            cmd,
            rc,
            msg: reply.get("msg").map(wire::snippet).unwrap_or_default(),
        }),
    }
}

fn required_field<'m>(
    cmd: &'static str,
    reply: &'m Message,
    field: &'static str,
) -> Result<&'m str, PmiError> {
    reply
        .get(field)
        .ok_or(PmiError::MissingField { cmd, field })
}

fn parse_field<T: std::str::FromStr>(
    cmd: &'static str,
    field: &'static str,
    value: &str,
) -> Result<T, PmiError> {
    value.parse().map_err(|_| PmiError::BadField {
        cmd,
        field,
        value: wire::snippet(value),
    })
}

/// A count the launcher may not know: negative means unknown.
fn optional_count(
    cmd: &'static str,
    field: &'static str,
    reply: &Message,
) -> Result<Option<u32>, PmiError> {
    let value = required_field(cmd, reply, field)?;
    let n: i64 = parse_field(cmd, field, value)?;
    if n < 0 {
        return Ok(None);
    }
    u32::try_from(n).map(Some).map_err(|_| PmiError::BadField {
        cmd,
        field,
        value: wire::snippet(value),
    })
}

fn check_key(key: &str, maxes: Maxes) -> Result<(), PmiError> {
    let reason = if !wire::is_valid_key(key) {
        "keys are non-empty printable ASCII without space or '='".to_owned()
    } else if key.len() >= maxes.key {
        format!(
            "{} bytes, the server's limit is {} with its NUL",
            key.len(),
            maxes.key
        )
    } else {
        return Ok(());
    };
    Err(PmiError::InvalidKey {
        key: wire::snippet(key),
        reason,
    })
}

fn check_put_key(key: &str, maxes: Maxes) -> Result<(), PmiError> {
    check_key(key, maxes)?;
    if key.starts_with(RESERVED_PREFIX) {
        return Err(PmiError::InvalidKey {
            key: wire::snippet(key),
            reason: format!("keys starting with {RESERVED_PREFIX} are reserved"),
        });
    }
    Ok(())
}

fn check_value(key: &str, value: &str, maxes: Maxes) -> Result<(), PmiError> {
    if !wire::is_valid_value(value) {
        return Err(invalid_value(key, "holds a space or a non-printable byte"));
    }
    if value.len() >= maxes.value {
        return Err(invalid_value(
            key,
            &format!(
                "{} bytes, the server's limit is {} with its NUL (use put_long)",
                value.len(),
                maxes.value
            ),
        ));
    }
    Ok(())
}

fn invalid_value(key: &str, reason: &str) -> PmiError {
    PmiError::InvalidValue {
        key: wire::snippet(key),
        reason: reason.to_owned(),
    }
}

fn parse_env<T: std::str::FromStr>(var: &'static str, value: &str) -> Result<T, PmiError> {
    value.trim().parse().map_err(|_| PmiError::Env {
        var,
        reason: format!("{value:?} is not a number"),
    })
}

fn required_env(
    lookup: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<u32, PmiError> {
    let value = lookup(var).ok_or_else(|| PmiError::Env {
        var,
        reason: "not set (PMI_FD is)".into(),
    })?;
    parse_env(var, &value)
}

fn check_rank(var: &'static str, rank: u32, size: u32) -> Result<(), PmiError> {
    if rank < size {
        Ok(())
    } else {
        Err(PmiError::Env {
            var,
            reason: format!("rank {rank} is not below size {size}"),
        })
    }
}

/// Splits `host:port` (the host may be a bracketed IPv6 address).
fn split_host_port(addr: &str) -> Result<(&str, u16), PmiError> {
    let bad = || PmiError::Env {
        var: "PMI_PORT",
        reason: format!("{addr:?} is not host:port"),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_counts() {
        // cap 10: first chunk holds 8 ("1:") or 8 ("2:"), others 10.
        assert_eq!(chunk_count(0, 10), Some(1));
        assert_eq!(chunk_count(8, 10), Some(1));
        assert_eq!(chunk_count(9, 10), Some(2));
        assert_eq!(chunk_count(18, 10), Some(2));
        assert_eq!(chunk_count(19, 10), Some(3));
        // 10 chunks: header "10:" leaves 7 in the first.
        assert_eq!(chunk_count(7 + 9 * 10, 10), Some(10));
        assert_eq!(chunk_count(7 + 9 * 10 + 1, 10), Some(11));
        assert_eq!(chunk_count(5, 2), None);
        assert_eq!(chunk_count(1, 3), Some(1));
    }

    #[test]
    fn decimal_lengths() {
        assert_eq!(decimal_len(1), 1);
        assert_eq!(decimal_len(9), 1);
        assert_eq!(decimal_len(10), 2);
        assert_eq!(decimal_len(1000), 4);
    }

    #[test]
    fn host_port() {
        assert_eq!(split_host_port("vm:42771").unwrap(), ("vm", 42771));
        assert_eq!(split_host_port("[::1]:7").unwrap(), ("::1", 7));
        assert!(split_host_port("vm").is_err());
        assert!(split_host_port(":1").is_err());
        assert!(split_host_port("vm:99999").is_err());
    }

    #[test]
    fn env_selection() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let s = PmiClient::from_env_with(env(&[])).unwrap();
        assert!(s.is_singleton());
        assert_eq!((s.rank(), s.size()), (0, 1));

        for var in ["PMIX_RANK", "PMIX_VERSION", "PRTE_LAUNCHED"] {
            let lookup = move |k: &str| (k == var).then(|| "1".to_owned());
            assert!(matches!(
                PmiClient::from_env_with(lookup),
                Err(PmiError::PmixLauncher { var: v }) if v == var
            ));
        }
        assert!(matches!(
            PmiClient::from_env_with(env(&[("PMI_FD", "7"), ("PMI_SIZE", "2")])),
            Err(PmiError::Env {
                var: "PMI_RANK",
                ..
            })
        ));
        assert!(matches!(
            PmiClient::from_env_with(env(&[
                ("PMI_FD", "x"),
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "2")
            ])),
            Err(PmiError::Env { var: "PMI_FD", .. })
        ));
        assert!(matches!(
            PmiClient::from_env_with(env(&[
                ("PMI_FD", "7"),
                ("PMI_RANK", "2"),
                ("PMI_SIZE", "2")
            ])),
            Err(PmiError::Env {
                var: "PMI_RANK",
                ..
            })
        ));
        assert!(matches!(
            PmiClient::from_env_with(env(&[("PMI_PORT", "vm:1")])),
            Err(PmiError::Env { var: "PMI_ID", .. })
        ));
        // PMI_FD wins over the PMIx markers.
        assert!(matches!(
            PmiClient::from_env_with(env(&[
                ("PMI_FD", "1"),
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "1"),
                ("PMIX_RANK", "0")
            ])),
            Err(PmiError::InheritedFd { fd: 1, .. })
        ));
    }
}
