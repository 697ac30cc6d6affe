//! The sans-IO [`ServerCore`]: the job's key-value space, its per-rank
//! quotas ([`KvsLimits`]) and the barrier, driven one request at a time
//! through [`ServerCore::handle`], which returns the [`Action`] a driver
//! carries out. The port-mode handshake of the core is in
//! [`handshake`](super::handshake).

use std::collections::HashMap;

use tracing::{debug, trace};

use super::ServerError;
use crate::client::RESERVED_PREFIX;
use crate::mapping::ProcessMapping;
use crate::wire::{self, Message, WireError};

/// `kvsname_max` advertised by `get_maxes`.
pub const KVSNAME_MAX: usize = 256;
/// `keylen_max` advertised by `get_maxes`; `put` refuses longer keys.
pub const KEYLEN_MAX: usize = 64;
/// `vallen_max` advertised by `get_maxes`; `put` refuses longer values.
pub const VALLEN_MAX: usize = 1024;

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
/// [module docs](super).
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
    pub(super) fn detach(&mut self, rank: u32) {
        if let Some(state) = self.ranks.get_mut(rank as usize) {
            state.attached = false;
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

pub(super) fn barrier_out() -> Message {
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

#[cfg(test)]
mod tests;
