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
//!
//! # Port mode
//!
//! Local ranks get one end of a socketpair as `PMI_FD` ([`Server::serve`])
//! and need no handshake. Remote ranks connect over TCP to the listener of
//! [`Server::listen_tcp_with`] (`PMI_PORT=host:port`, `PMI_ID=<rank>`).
//! Without a secret the handshake is hydra's (`>` is the client, `<` the
//! server):
//!
//! ```text
//! > cmd=initack pmiid=1
//! < cmd=initack
//! < cmd=set size=4
//! < cmd=set rank=1
//! < cmd=set debug=0
//! ```
//!
//! and whoever can reach the port can claim any rank that has not connected
//! yet.
//!
//! # Authenticated port mode
//!
//! With [`PortOptions::with_secret`] (or [`Server::listen_tcp_authenticated`])
//! the server speaks first, with a fresh 32-byte nonce per connection, and
//! the `initack` must carry `proof`, the BLAKE3 MAC of the nonce and the
//! `pmiid` under a key derived from the job's [`JobSecret`] (see
//! [`crate::auth`]; the hex values below are illustrative):
//!
//! ```text
//! < cmd=challenge nonce=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//! > cmd=initack pmiid=1 proof=5d41402abc4b2a76b9719d911017c592e8d4d8a1f3c0a7ee2c5b3b0a2e6c1f44
//! < cmd=initack
//! < cmd=set size=4
//! < cmd=set rank=1
//! < cmd=set debug=0
//! ```
//!
//! A missing, malformed or wrong proof gets `cmd=initack rc=-1
//! msg=authentication_failed`; the proof is checked (in constant time)
//! before the rank is looked at, so a replayed `initack` fails as a wrong
//! proof whatever rank it names. A rank is claimed once: a second `initack`
//! for a rank that has (or had) a connection gets `cmd=initack rc=-1
//! msg=pmiid_refused`, proof or not. The client side is
//! [`PmiClient::connect_port_authenticated`](crate::PmiClient::connect_port_authenticated),
//! which [`PmiClient::from_env`](crate::PmiClient::from_env) uses when
//! [`SECRET_ENV`](crate::auth::SECRET_ENV) (`UDBTL_PMI_SECRET`) is set.
//!
//! What this protects: the handshake. The rest of the connection is plain
//! text, so an on-path attacker who can inject into or hijack the TCP
//! stream after the handshake is not stopped; an off-path host that can
//! only connect to the port can no longer claim a rank, read or write the
//! key-value space, or abort the job. The secret must reach remote ranks
//! where no other local user can read it: on the launcher's standard input
//! or in the environment of the rank (`/proc/PID/environ` is readable by the
//! same user and root only), never on a command line (`/proc/PID/cmdline`
//! is world-readable) or in a world-readable file.
//!
//! # Bounds
//!
//! * At most [`PortOptions::with_max_handshakes`] connections per listener
//!   are in their handshake at once (default [`DEFAULT_MAX_HANDSHAKES`]);
//!   while that many are, the listener accepts nothing, and new
//!   connections wait in the kernel's listen queue in the order they came.
//!   At most [`PortOptions::with_max_handshakes_per_source`] of them come
//!   from one address (default [`DEFAULT_MAX_HANDSHAKES_PER_SOURCE`]); more
//!   from it wait, accepted and without a thread, for its slots to free,
//!   up to the cap; beyond that one is closed as soon as it is accepted. So
//!   a host that holds idle connections, or reconnects as each is closed,
//!   leaves the other hosts' ranks room. Each connection in its handshake has a thread; a
//!   connection that completes it keeps that thread as its rank's. So a
//!   listener runs at most `cap + size` threads, plus its accept thread.
//! * A handshake must be over within [`PortOptions::with_handshake_timeout`]
//!   (default [`DEFAULT_HANDSHAKE_TIMEOUT`]) from the accept: a deadline for
//!   the whole exchange, so a peer that sends a byte at a time is cut off
//!   too.
//! * A line is read up to [`wire::MAX_LINE`] bytes and never buffered
//!   beyond: a longer one closes the connection with `PMI line longer than
//!   65536 bytes` (before the handshake, and from a rank).
//! * Each rank may hold [`KvsLimits`] of the key-value space (default 1 MiB
//!   of keys plus values and 4096 keys); a `put` beyond gets `cmd=put_result
//!   rc=-1 msg=kvs_quota_exceeded` and the rank's connection is closed,
//!   reported as [`ServerEvent::ProtocolError`] with its rank.
//!
//! Every refused or failed port-mode connection is closed, counted in
//! [`Server::stats`], named with its peer address in a `tracing` warning,
//! and reported as [`ServerEvent::ProtocolError`] with `rank: None`: such a
//! connection is no rank of the job, so a launcher reports it and carries
//! on (udrun prints `ignored a PMI_PORT connection: ...`).
//!
//! # What a launcher does
//!
//! 1. [`JobSecret::generate`] once per job.
//! 2. `server.listen_tcp_authenticated((addr, 0), secret.clone())` on the
//!    address the remote ranks are told to use (not `0.0.0.0`), or
//!    [`Server::listen_tcp_with`] to change the bounds.
//! 3. Give each remote rank `PMI_PORT`, `PMI_ID` and
//!    `UDBTL_PMI_SECRET=<secret.to_hex()>` through the remote launcher's
//!    standard input (e.g. a line the remote shell reads and exports before
//!    it execs the rank), never on its command line.
//! 4. Treat [`ServerEvent::ProtocolError`] with `rank: None` as a warning,
//!    and [`Server::stats`] as the count to report at the end.
//! 5. Time the start-up itself: a rank that never connects simply never
//!    shows up; the server does not know which ranks a launcher expects
//!    when. [`ServerEvent::Connected`] tells when each port-mode rank
//!    completed its handshake (udrun's `--startup-timeout` uses it).
//!
//! [`Message`]: crate::wire::Message
//! [`JobSecret`]: crate::auth::JobSecret
//! [`JobSecret::generate`]: crate::auth::JobSecret::generate
//! [`wire::MAX_LINE`]: crate::wire::MAX_LINE

use std::io;

// The sans-IO core, its `Action`s and the key-value space limits.
mod core;
// The core's side of the port-mode handshake.
mod handshake;
// The TCP listeners of port mode and their bounds (`PortOptions`).
mod port;
// The threaded `Server`, its events and counters.
mod threaded;

pub use self::core::{
    Action, KEYLEN_MAX, KVS_BYTES_PER_RANK, KVS_KEYS_PER_RANK, KVSNAME_MAX, KvsLimits, ServerCore,
    VALLEN_MAX,
};
pub use self::handshake::{Handshake, Refusal, challenge_message};
pub use self::port::{
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
    PortOptions,
};
pub use self::threaded::{Server, ServerEvent, ServerStats};

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
