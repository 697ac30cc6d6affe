//! Errors of the PMI client.

use std::io;
use std::time::Duration;

use crate::wire::WireError;

/// A failure of the PMI client. Every variant that concerns one request
/// names its PMI command (`cmd`), e.g. `"barrier_in"`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PmiError {
    /// A launcher variable is missing or unparsable.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable, e.g. `PMI_RANK`.
        var: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The environment shows a PMIx launcher, which this PMI-1 client cannot
    /// talk to.
    #[error(
        "{var} is set: the job was started by a PMIx launcher, which udbtl does not support; \
         launch with udrun, mpiexec.hydra, or `srun --mpi=pmi2` (which also serves PMI-1)"
    )]
    PmixLauncher {
        /// The variable that revealed it.
        var: &'static str,
    },
    /// `PMI_FD` does not name a usable socket, or was already taken.
    #[error("PMI_FD={fd}: {source}")]
    InheritedFd {
        /// The descriptor number from `PMI_FD`.
        fd: i32,
        /// Why it cannot be used.
        #[source]
        source: io::Error,
    },
    /// Connecting to `PMI_PORT` failed.
    #[error("connecting to the PMI server at {addr}: {source}")]
    Connect {
        /// The `host:port` from `PMI_PORT`.
        addr: String,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// An authenticated client got no `cmd=challenge` from the server in
    /// time: the server does not require the job secret (it waits for the
    /// client's `initack`), or is not udbtl's.
    #[error(
        "the PMI server at {addr} sent no challenge within {waited:?}: the job secret is set \
         (UDBTL_PMI_SECRET) but the server does not ask for it; launcher and ranks disagree \
         on authenticated PMI"
    )]
    NoChallenge {
        /// The `host:port` from `PMI_PORT`.
        addr: String,
        /// How long the client waited.
        waited: Duration,
    },
    /// An authenticated client's connections kept being closed before the
    /// server's challenge, for the whole retry window.
    #[error(
        "the PMI server at {addr} closed the connection before its challenge {attempts} times \
         over {window:?}: its handshake slots stay full (a flood of connections?), or it is not \
         a PMI server"
    )]
    ClosedBeforeChallenge {
        /// The `host:port` from `PMI_PORT`.
        addr: String,
        /// How many connections were tried.
        attempts: u32,
        /// The retry window, [`PORT_RETRY_WINDOW`](crate::client::PORT_RETRY_WINDOW).
        window: Duration,
    },
    /// The server opened with `cmd=challenge`: it requires the job secret,
    /// which this client was not given.
    #[error(
        "PMI initack: the PMI server requires the job secret, but UDBTL_PMI_SECRET is not set \
         for this rank"
    )]
    SecretRequired,
    /// Reading or writing the PMI connection failed.
    #[error("PMI {cmd}: I/O error: {source}")]
    Io {
        /// The command in progress.
        cmd: &'static str,
        /// The stream error.
        #[source]
        source: io::Error,
    },
    /// The server closed the connection before replying.
    #[error("PMI {cmd}: the server closed the connection")]
    Eof {
        /// The command in progress.
        cmd: &'static str,
    },
    /// The reply was not a PMI-1 message.
    #[error("PMI {cmd}: malformed reply: {source}")]
    Malformed {
        /// The command in progress.
        cmd: &'static str,
        /// What was wrong with it.
        #[source]
        source: WireError,
    },
    /// A request could not be encoded (an argument holds a space or a
    /// non-printable byte).
    #[error("PMI {cmd}: cannot encode the request: {source}")]
    Encode {
        /// The command.
        cmd: &'static str,
        /// The offending key or value.
        #[source]
        source: WireError,
    },
    /// The reply was for another command.
    #[error("PMI {cmd}: expected a `{expected}` reply, got `{got}`")]
    UnexpectedReply {
        /// The command in progress.
        cmd: &'static str,
        /// The reply command that was expected.
        expected: &'static str,
        /// The reply received (truncated).
        got: String,
    },
    /// The server answered with `rc` other than 0.
    #[error("PMI {cmd} failed: rc={rc} msg={msg}")]
    Failed {
        /// The command.
        cmd: &'static str,
        /// The server's return code.
        rc: i64,
        /// The server's `msg`, or empty.
        msg: String,
    },
    /// A reply lacks a field the command needs.
    #[error("PMI {cmd}: reply has no `{field}`")]
    MissingField {
        /// The command.
        cmd: &'static str,
        /// The missing key.
        field: &'static str,
    },
    /// A reply field has an unusable value.
    #[error("PMI {cmd}: reply field {field}={value:?} is invalid")]
    BadField {
        /// The command.
        cmd: &'static str,
        /// The key.
        field: &'static str,
        /// Its value (truncated).
        value: String,
    },
    /// A key passed to `put`/`get` is not acceptable.
    #[error("PMI key {key:?}: {reason}")]
    InvalidKey {
        /// The key (truncated).
        key: String,
        /// Why.
        reason: String,
    },
    /// A value passed to `put` is not acceptable.
    #[error("PMI value for key {key:?}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The call is not allowed in the client's current state (before
    /// `init`, after `finalize`, or a second `init`).
    #[error("PMI {cmd}: not allowed {state}")]
    State {
        /// The command.
        cmd: &'static str,
        /// The state, e.g. `"before init"`.
        state: &'static str,
    },
    /// A request was made while a barrier started by
    /// [`barrier_start`](crate::PmiClient::barrier_start) is still in flight:
    /// its `barrier_out` must be awaited with
    /// [`barrier_poll`](crate::PmiClient::barrier_poll) first (PMI-1 is a
    /// strict request/reply protocol). Nothing was sent.
    #[error("PMI {cmd}: not allowed while a barrier is in flight (poll it to completion first)")]
    BarrierInFlight {
        /// The refused command, e.g. `"get"` (`"barrier_in"` for a second
        /// `barrier_start`).
        cmd: &'static str,
    },
    /// [`barrier_poll`](crate::PmiClient::barrier_poll) was called with no
    /// barrier in flight: never started, or already over (its `Ok(true)` or
    /// error ends it).
    #[error("PMI barrier_poll: no barrier in flight (call barrier_start first)")]
    NoBarrierInFlight,
    /// [`barrier_start`](crate::PmiClient::barrier_start) was called on a
    /// client whose connection cannot be polled without blocking: one built by
    /// [`PmiClient::new`](crate::PmiClient::new) from an arbitrary reader.
    /// Use [`PmiClient::from_socket`](crate::PmiClient::from_socket), or the
    /// blocking [`barrier`](crate::PmiClient::barrier). Nothing was sent.
    #[error(
        "PMI barrier_in: this client's connection cannot be polled (built by PmiClient::new); \
         use PmiClient::from_socket or the blocking barrier"
    )]
    NotPollable,
    /// A value stored by `put_long` could not be read back whole.
    #[error("PMI long value {key:?}: {reason}")]
    LongValue {
        /// The base key.
        key: String,
        /// What is missing or malformed.
        reason: String,
    },
}
