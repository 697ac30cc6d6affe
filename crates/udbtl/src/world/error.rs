//! Why starting a job, or a call on it, failed.

use udbtl_btl::{BtlError, TransportError};
use udbtl_pmi::PmiError;

/// Starting the job failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The PMI exchange with the launcher failed.
    #[error("PMI: {0}")]
    Pmi(#[from] PmiError),
    /// The transport could not be opened.
    #[error("transport: {0}")]
    Btl(#[from] BtlError),
    /// A peer published no address, or one this process cannot reach.
    #[error("rank {rank} is unreachable: {reason}")]
    Unreachable {
        /// The peer.
        rank: u32,
        /// Why.
        reason: String,
    },
    /// `UDBTL_PMI_SECRET` is set (so authenticated datagrams would key from
    /// it) but is not a job secret. The value is never quoted.
    #[error("UDBTL_PMI_SECRET: {0}")]
    BadJobSecret(#[source] udbtl_pmi::SecretError),
    /// `UDBTL_MODEX` held something other than `bulk` or `lazy`.
    #[error("UDBTL_MODEX={0:?}: expected bulk or lazy")]
    BadModexMode(String),
    /// `UDBTL_DUMP` held something other than a boolean.
    #[error("UDBTL_DUMP={value:?}: {reason}")]
    BadDump {
        /// The value as set.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A peer's rank is outside the job.
    #[error("rank {rank} is outside a job of {size}")]
    NoSuchRank {
        /// The rank asked for.
        rank: u32,
        /// The job size.
        size: u32,
    },
    /// The transport could not start: an invalid `UDBTL_FAULT_*` rate, or
    /// no module.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Messages were lost: a peer was declared lost, or sends to it failed.
    /// The transport never drops a message silently; this is how a rank
    /// hears of it (at the latest from `finalize`).
    #[error("messages were lost: {0}")]
    Lost(String),
    /// A message did not fit, or no fragment became free in time.
    #[error("cannot send {len} bytes to rank {rank}: {reason}")]
    Send {
        /// Destination.
        rank: u32,
        /// Message length.
        len: usize,
        /// Why.
        reason: String,
    },
}
