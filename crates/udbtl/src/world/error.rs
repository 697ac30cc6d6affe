//! Why starting a job, or a call on it, failed.

use udbtl_btl::{BtlError, TransportError};
use udbtl_pmi::PmiError;

/// Starting or leaving the job failed, or connecting to a peer.
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
    #[error(transparent)]
    Lost(#[from] Lost),
    /// A send, within a call that sends for the program (a barrier).
    #[error(transparent)]
    Send(#[from] SendError),
}

/// Messages were lost: a peer was declared lost, or sends to it failed. The
/// transport never drops a message silently; this is how a rank hears of
/// it, from [`World::check`](super::World::check) or, at the latest, from
/// [`World::finalize`](super::World::finalize).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("messages were lost: {report}")]
pub struct Lost {
    report: String,
}

impl Lost {
    pub(super) const fn new(report: String) -> Self {
        Self { report }
    }

    /// What was lost, naming this rank, the peers and the counts (for
    /// example `rank 1: rank 3 lost (...); 12 sends to rank 3 failed`).
    pub fn report(&self) -> &str {
        &self.report
    }
}

/// A send failed: nothing of the message will be delivered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The destination is not a rank of the job, or cannot be reached (its
    /// address could not be fetched or is on no network of this process).
    #[error(transparent)]
    Connect(Box<InitError>),
    /// The message does not fit the one datagram it must travel in.
    #[error(
        "cannot send {len} bytes to rank {rank}: one datagram carries at most {limit} \
         (`World::send` cuts longer messages, when the transport is reliable: \
         it is unless UDBTL_RELIABLE=0)"
    )]
    TooLong {
        /// Destination.
        rank: u32,
        /// Message length.
        len: usize,
        /// The most one datagram carries (the eager limit).
        limit: usize,
    },
    /// Messages to or from some peer were lost: the message was not sent.
    #[error(transparent)]
    Lost(#[from] Lost),
    /// The transport refused the message.
    #[error("cannot send {len} bytes to rank {rank}: {reason}")]
    Refused {
        /// Destination.
        rank: u32,
        /// Message length.
        len: usize,
        /// Why.
        reason: String,
    },
}

impl From<InitError> for SendError {
    fn from(err: InitError) -> Self {
        Self::Connect(Box::new(err))
    }
}

/// A blocking receive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// Messages were lost (a peer was declared lost), so the one awaited
    /// may never come.
    #[error(transparent)]
    Lost(#[from] Lost),
    /// The tag has a callback ([`World::on_receive`](super::World::on_receive)),
    /// which gets its messages: none would ever be queued for a receive.
    #[error("{tag} has a receive callback, which takes its messages")]
    HasCallback {
        /// The tag.
        tag: super::Tag,
    },
}
