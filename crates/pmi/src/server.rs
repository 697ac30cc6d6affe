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
//!   one more is closed as soon as it is accepted. Each connection in its
//!   handshake has a thread; a connection that completes it keeps that
//!   thread as its rank's. So a listener runs at most `cap + size` threads,
//!   plus its accept thread.
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

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::{debug, trace, warn};

use crate::auth::{self, JobSecret, NONCE_LEN};
use crate::client::RESERVED_PREFIX;
use crate::mapping::ProcessMapping;
use crate::wire::{self, Message, ReadError, WireError};

/// `kvsname_max` advertised by `get_maxes`.
pub const KVSNAME_MAX: usize = 256;
/// `keylen_max` advertised by `get_maxes`; `put` refuses longer keys.
pub const KEYLEN_MAX: usize = 64;
/// `vallen_max` advertised by `get_maxes`; `put` refuses longer values.
pub const VALLEN_MAX: usize = 1024;

/// Default of [`PortOptions::with_handshake_timeout`]: how long a
/// port-mode connection may take, from its accept to the end of the
/// server's handshake replies.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of [`PortOptions::with_max_handshakes`]: how many port-mode
/// connections may be in their handshake at once, per listener.
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;

/// Default [`KvsLimits::bytes`]: keys plus values one rank may hold.
pub const KVS_BYTES_PER_RANK: usize = 1 << 20;

/// Default [`KvsLimits::keys`]: keys one rank may hold.
pub const KVS_KEYS_PER_RANK: usize = 4096;

/// How much of the key-value space each rank may hold. An entry counts
/// against the rank that last `put` it, for `key.len() + value.len()` bytes
/// and one key. A `put` that would take a rank over either limit gets
/// `cmd=put_result rc=-1 msg=kvs_quota_exceeded` and its connection is
/// closed ([`Action::Close`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvsLimits {
    /// Bytes of keys plus values.
    pub bytes: usize,
    /// Number of keys.
    pub keys: usize,
}

impl KvsLimits {
    /// [`KVS_BYTES_PER_RANK`] and [`KVS_KEYS_PER_RANK`].
    pub const DEFAULT: Self = Self {
        bytes: KVS_BYTES_PER_RANK,
        keys: KVS_KEYS_PER_RANK,
    };
}

impl Default for KvsLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

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
        /// Which kind of refusal, for counting.
        reason: Refusal,
    },
}

/// Why [`ServerCore::handle_initack`] (or
/// [`handle_proved_initack`](ServerCore::handle_proved_initack)) refused a
/// connection, with the `msg` of its `cmd=initack rc=-1` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The first message was not `cmd=initack` (`msg=expected_initack`).
    NotInitack,
    /// `pmiid` is missing, not a number, or not a rank of the job
    /// (`msg=invalid_pmiid`, or `msg=pmiid_refused` when out of range).
    InvalidPmiid,
    /// The listener requires the job secret and the `proof` is missing,
    /// malformed or wrong (`msg=authentication_failed`).
    Unauthenticated,
    /// The rank already has a connection: a rank is claimed once
    /// (`msg=pmiid_refused`).
    RankClaimed,
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

/// Per-rank protocol state.
#[derive(Debug, Clone, Copy, Default)]
struct RankState {
    attached: bool,
    in_barrier: bool,
    finalized: bool,
    /// Bytes of keys plus values this rank owns in the KVS.
    kvs_bytes: usize,
    /// Keys this rank owns in the KVS.
    kvs_keys: usize,
}

/// A KVS value and the rank whose quota it counts against.
#[derive(Debug, Clone)]
struct Entry {
    value: String,
    owner: u32,
}

/// The sans-IO PMI-1 server: the job's key-value space and barrier. See the
/// [module docs](self).
#[derive(Debug)]
pub struct ServerCore {
    size: u32,
    kvsname: String,
    appnum: u32,
    kvs: HashMap<String, Entry>,
    kvs_limits: KvsLimits,
    process_mapping: ProcessMapping,
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
            kvs_limits: KvsLimits::DEFAULT,
            process_mapping: ProcessMapping::from_nodes(&vec![0; size as usize]),
            ranks: vec![RankState::default(); size as usize],
            barrier_count: 0,
            barrier_epoch: 0,
        })
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Sets the `PMI_process_mapping` ranks read: which node each runs on
    /// (all on one node until set).
    pub fn set_process_mapping(&mut self, mapping: ProcessMapping) {
        self.process_mapping = mapping;
    }

    /// The key-value space name.
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }

    /// Sets how much of the key-value space each rank may hold (default
    /// [`KvsLimits::DEFAULT`]). Applies to later `put`s.
    pub fn set_kvs_limits(&mut self, limits: KvsLimits) {
        self.kvs_limits = limits;
    }

    /// The per-rank key-value space limits.
    pub fn kvs_limits(&self) -> KvsLimits {
        self.kvs_limits
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

    /// Handles the first message of a port-mode connection without the job
    /// secret, `cmd=initack pmiid=<rank>`, and attaches that rank. A rank
    /// that already has a connection is refused ([`Refusal::RankClaimed`]).
    pub fn handle_initack(&mut self, msg: &Message) -> Handshake {
        self.initack(msg, None)
    }

    /// Handles the first message of an authenticated port-mode connection,
    /// to which the server sent `cmd=challenge nonce=<hex of nonce>`: it must
    /// be `cmd=initack pmiid=<rank> proof=<hex>` with the proof of
    /// [`JobSecret::proof`]`(nonce, pmiid)`, checked in constant time before
    /// the rank is looked at. Then as [`handle_initack`](Self::handle_initack).
    pub fn handle_proved_initack(
        &mut self,
        msg: &Message,
        secret: &JobSecret,
        nonce: &[u8; NONCE_LEN],
    ) -> Handshake {
        self.initack(msg, Some((secret, nonce)))
    }

    fn initack(
        &mut self,
        msg: &Message,
        auth: Option<(&JobSecret, &[u8; NONCE_LEN])>,
    ) -> Handshake {
        let reject = |reason: Refusal, msg: &str, detail: String| Handshake::Rejected {
            reply: Message::new("initack").with("rc", "-1").with("msg", msg),
            detail,
            reason,
        };
        if msg.cmd() != "initack" || msg.is_multiline() {
            return reject(
                Refusal::NotInitack,
                "expected_initack",
                format!("expected cmd=initack, got cmd={}", wire::snippet(msg.cmd())),
            );
        }
        let pmiid = msg.get("pmiid");
        if let Some((secret, nonce)) = auth {
            let proved = match (pmiid, msg.get("proof")) {
                (Some(pmiid), Some(proof)) => secret
                    .verify(nonce, pmiid, proof)
                    .then_some(())
                    .ok_or("a wrong proof"),
                (_, None) => Err("no proof (this server requires the job secret)"),
                (None, Some(_)) => Err("a proof but no pmiid"),
            };
            if let Err(what) = proved {
                return reject(
                    Refusal::Unauthenticated,
                    "authentication_failed",
                    format!(
                        "initack for pmiid {:?} with {what}",
                        pmiid.map(wire::snippet).unwrap_or_default()
                    ),
                );
            }
        }
        let Some(rank) = pmiid.and_then(|id| id.parse::<u32>().ok()) else {
            return reject(
                Refusal::InvalidPmiid,
                "invalid_pmiid",
                format!("initack with pmiid {:?}", pmiid.map(wire::snippet)),
            );
        };
        match self.attach(rank) {
            Ok(()) => {}
            Err(e @ ServerError::AlreadyConnected { .. }) => {
                return reject(
                    Refusal::RankClaimed,
                    "pmiid_refused",
                    format!("second claim of rank {rank} refused: {e}"),
                );
            }
            Err(e) => return reject(Refusal::InvalidPmiid, "pmiid_refused", e.to_string()),
        }
        debug!(rank, authenticated = auth.is_some(), "PMI_PORT handshake");
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
            "put" => self.put(rank, msg),
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

    fn put(&mut self, rank: u32, msg: &Message) -> Action {
        let fail =
            |why: &str| Action::Reply(Message::new("put_result").with("rc", "-1").with("msg", why));
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
        // What the rank would own afterwards: a key it already owns is
        // replaced, one owned by another rank changes hands.
        let state = self.ranks[rank as usize];
        let (mut bytes, mut keys) = (state.kvs_bytes, state.kvs_keys);
        let old = self
            .kvs
            .get(key)
            .map(|e| (e.owner, key.len() + e.value.len()));
        if let Some((owner, size)) = old {
            if owner == rank {
                bytes -= size;
                keys -= 1;
            }
        }
        bytes += key.len() + value.len();
        keys += 1;
        let limits = self.kvs_limits;
        if bytes > limits.bytes || keys > limits.keys {
            return Action::Close {
                reply: Some(
                    Message::new("put_result")
                        .with("rc", "-1")
                        .with("msg", "kvs_quota_exceeded"),
                ),
                detail: format!(
                    "rank {rank}: put of key {:?} would make it hold {bytes} bytes in {keys} keys \
                     of the key-value space, over its quota of {} bytes and {} keys",
                    wire::snippet(key),
                    limits.bytes,
                    limits.keys
                ),
            };
        }
        if let Some((owner, size)) = old {
            if owner != rank {
                let previous = &mut self.ranks[owner as usize];
                previous.kvs_bytes -= size;
                previous.kvs_keys -= 1;
            }
        }
        let state = &mut self.ranks[rank as usize];
        state.kvs_bytes = bytes;
        state.kvs_keys = keys;
        let entry = Entry {
            value: value.to_owned(),
            owner: rank,
        };
        self.kvs.insert(key.to_owned(), entry);
        Action::Reply(
            Message::new("put_result")
                .with("rc", "0")
                .with("msg", "success"),
        )
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
            "PMI_process_mapping" => Some(self.process_mapping.to_string()),
            _ => self.kvs.get(key).map(|e| e.value.clone()),
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
    counters: Counters,
}

/// The atomics behind [`ServerStats`].
#[derive(Debug, Default)]
struct Counters {
    connections_accepted: AtomicU64,
    accept_errors: AtomicU64,
    connections_refused_over_cap: AtomicU64,
    handshakes_in_progress: AtomicU64,
    handshakes_completed: AtomicU64,
    handshake_failures: AtomicU64,
    claims_refused: AtomicU64,
    protocol_errors: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What the threaded [`Server`] has seen so far ([`Server::stats`]).
///
/// Of the port-mode connections accepted, each is eventually counted in
/// exactly one of `connections_refused_over_cap`, `handshakes_completed`,
/// `handshake_failures` and `claims_refused`; until then it is in
/// `handshakes_in_progress`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStats {
    /// TCP connections accepted by the port-mode listeners (the server's own
    /// wake-up connection at shutdown excluded).
    pub connections_accepted: u64,
    /// Failed `accept(2)` calls: out of descriptors, or (`ECONNABORTED`) a
    /// connection reset by its peer before it could be accepted.
    pub accept_errors: u64,
    /// Connections closed at once because [`PortOptions::with_max_handshakes`]
    /// others were in their handshake (or no thread could be started).
    pub connections_refused_over_cap: u64,
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
    /// [authenticated port mode](self#authenticated-port-mode)).
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
    /// handshake (see the [module docs](self#port-mode)) names a rank that
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

    /// The counts of connections, handshakes and protocol errors so far.
    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ServerStats {
            connections_accepted: get(&c.connections_accepted),
            accept_errors: get(&c.accept_errors),
            connections_refused_over_cap: get(&c.connections_refused_over_cap),
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

/// `cmd=challenge nonce=<hex>`, the first line of an authenticated
/// port-mode connection.
pub fn challenge_message(nonce: &[u8; NONCE_LEN]) -> Message {
    Message::new("challenge").with("nonce", auth::encode_hex(nonce))
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
        c.set_process_mapping(ProcessMapping::from_nodes(&[0, 1]));
        let r = reply(c.handle(1, &msg("cmd=get kvsname=kvs_test key=PMI_process_mapping")));
        assert_eq!(r.get("value"), Some("(vector,(0,1,1),(1,1,1))"));
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

    fn refusal(h: Handshake) -> (Refusal, Message) {
        match h {
            Handshake::Rejected { reason, reply, .. } => (reason, reply),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn proved_initack() {
        let secret = JobSecret::from_bytes([9; 32]);
        let nonce = [3; NONCE_LEN];
        let proof = |pmiid: &str| auth::encode_hex(&secret.proof(&nonce, pmiid));
        let mut c = core(3);
        // No proof, a wrong one, one for another rank or nonce, or another
        // secret's: refused before the rank is looked at.
        let other_nonce = auth::encode_hex(&secret.proof(&[4; NONCE_LEN], "0"));
        let other_secret = auth::encode_hex(&JobSecret::from_bytes([1; 32]).proof(&nonce, "0"));
        for bad in [
            "cmd=initack pmiid=0".to_owned(),
            format!("cmd=initack pmiid=0 proof={}", "0".repeat(64)),
            format!("cmd=initack pmiid=0 proof={}", proof("1")),
            format!("cmd=initack pmiid=0 proof={other_nonce}"),
            format!("cmd=initack pmiid=0 proof={other_secret}"),
            format!("cmd=initack pmiid=0 proof={}", &proof("0")[..63]),
            format!("cmd=initack proof={}", proof("0")),
        ] {
            let (reason, reply) = refusal(c.handle_proved_initack(&msg(&bad), &secret, &nonce));
            assert_eq!(reason, Refusal::Unauthenticated, "{bad}");
            assert_eq!(
                reply.to_line().unwrap(),
                "cmd=initack rc=-1 msg=authentication_failed\n"
            );
        }
        // Nothing was attached by the refusals.
        let good = msg(&format!("cmd=initack pmiid=0 proof={}", proof("0")));
        assert!(matches!(
            c.handle_proved_initack(&good, &secret, &nonce),
            Handshake::Accepted { rank: 0, .. }
        ));
        // A second claim, proved or not, is refused.
        let (reason, _) = refusal(c.handle_proved_initack(&good, &secret, &nonce));
        assert_eq!(reason, Refusal::RankClaimed);
        let (reason, _) = refusal(c.handle_initack(&msg("cmd=initack pmiid=0")));
        assert_eq!(reason, Refusal::RankClaimed);
        // A proved pmiid out of range or not a number.
        for id in ["3", "x"] {
            let line = format!("cmd=initack pmiid={id} proof={}", proof(id));
            let (reason, _) = refusal(c.handle_proved_initack(&msg(&line), &secret, &nonce));
            assert_eq!(reason, Refusal::InvalidPmiid, "{id}");
        }
        let (reason, _) = refusal(c.handle_proved_initack(&msg("cmd=init"), &secret, &nonce));
        assert_eq!(reason, Refusal::NotInitack);
        assert_eq!(
            challenge_message(&nonce).to_line().unwrap(),
            format!("cmd=challenge nonce={}\n", "03".repeat(NONCE_LEN))
        );
    }

    #[test]
    fn kvs_quota_per_rank() {
        let mut c = core(2);
        c.set_kvs_limits(KvsLimits { bytes: 40, keys: 3 });
        let put = |c: &mut ServerCore, rank: u32, key: &str, value: &str| {
            c.handle(rank, &msg(&format!("cmd=put key={key} value={value}")))
        };
        let ok = |a: Action| assert_eq!(reply(a).get("rc"), Some("0"));
        // Rank 0: three keys of 2 + 8 bytes.
        for key in ["k0", "k1", "k2"] {
            ok(put(&mut c, 0, key, "12345678"));
        }
        // Replacing its own key does not count twice.
        ok(put(&mut c, 0, "k2", "1234567890"));
        // A fourth key is over the key count: refused and closed.
        match put(&mut c, 0, "k3", "v") {
            Action::Close {
                reply: Some(reply),
                detail,
            } => {
                assert_eq!(
                    reply.to_line().unwrap(),
                    "cmd=put_result rc=-1 msg=kvs_quota_exceeded\n"
                );
                assert!(
                    detail.contains("rank 0") && detail.contains("quota"),
                    "{detail}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            reply(c.handle(1, &msg("cmd=get key=k3"))).get("rc"),
            Some("-1")
        );
        // Rank 1 has its own quota, in bytes: 2 + 30 fits, 9 more do not.
        ok(put(&mut c, 1, "m0", &"v".repeat(30)));
        assert!(matches!(
            put(&mut c, 1, "m1", "1234567"),
            Action::Close { .. }
        ));
        // Taking over rank 0's key moves it to rank 1's account, which is
        // full; rank 0's then has room again.
        ok(put(&mut c, 1, "m0", "v"));
        ok(put(&mut c, 1, "k0", "v"));
        ok(put(&mut c, 0, "k3", "v"));
        assert_eq!(
            reply(c.handle(0, &msg("cmd=get key=k0"))).get("value"),
            Some("v")
        );
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
