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
//!
//! [`SECRET_ENV`]: crate::auth::SECRET_ENV
//! [`JobSecret::proof`]: crate::auth::JobSecret::proof

use std::collections::HashMap;
use std::fmt;

use tracing::{debug, trace};

use crate::error::PmiError;
use crate::wire::{self, Message};

use self::conn::{Conn, check_rc, check_reply, rc_of};

// Finding the launcher and making a client: PMI_FD, PMI_PORT (with or
// without the job secret), a caller's stream or socket, or singleton.
mod connect;
// The connection to a server: requests, replies, the nonblocking read of the
// barrier's reply, and the handshake and `init` exchanges.
mod conn;
// Values longer than the server's limit, split across keys.
mod long;

pub use self::connect::{CHALLENGE_TIMEOUT, PORT_RETRY_WINDOW};
pub use self::long::LONG_SEP;

/// Key prefix reserved for the launcher's own attributes.
pub const RESERVED_PREFIX: &str = "PMI_";

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
        conn.discard_partial();
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
